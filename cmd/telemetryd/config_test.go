package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/retention"
	"github.com/telemetryd/telemetryd/store"
)

func envMap(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestConfigDefaults(t *testing.T) {
	inLane(t, lanes.general)
	c := DefaultConfig()
	require.NoError(t, c.parseFlags("telemetryd", nil, envMap(nil), &bytes.Buffer{}))
	assert.Equal(t, "./data", c.DataDir)
	assert.Equal(t, "127.0.0.1:8080", c.HTTPAddr)
	assert.Equal(t, "", c.NATSURL)
	assert.Equal(t, "127.0.0.1:4222", c.NATSListen)
	assert.Equal(t, "telemetry", c.SubjectPrefix)
	assert.Equal(t, 720*time.Hour, c.Retention)
	assert.Equal(t, time.Hour, c.RetentionInterval)
	assert.Equal(t, 5*time.Minute, c.MaxFutureSkew)
	assert.True(t, c.SyncWrites, "synced is the default durability mode")
	assert.Equal(t, "info", c.LogLevel)
	assert.Equal(t, "text", c.LogFormat)
}

func TestConfigEnvAndFlagPrecedence(t *testing.T) {
	inLane(t, lanes.general)
	env := envMap(map[string]string{
		"TELEMETRY_DATA_DIR":       "/env/data",
		"TELEMETRY_RETENTION":      "48h",
		"TELEMETRY_SYNC_WRITES":    "false",
		"TELEMETRY_SUBJECT_PREFIX": "envprefix",
		"TELEMETRY_LOG_FORMAT":     "json",
	})
	c := DefaultConfig()
	require.NoError(t, c.parseFlags("telemetryd", []string{"-data-dir", "/flag/data", "-subject-prefix=flagprefix"}, env, &bytes.Buffer{}))
	assert.Equal(t, "/flag/data", c.DataDir, "a flag wins over the environment")
	assert.Equal(t, "flagprefix", c.SubjectPrefix)
	assert.Equal(t, 48*time.Hour, c.Retention, "the environment applies where no flag is given")
	assert.False(t, c.SyncWrites)
	assert.Equal(t, "json", c.LogFormat)
}

func TestConfigRejectsBadValues(t *testing.T) {
	inLane(t, lanes.general)
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		want string
	}{
		"negative retention":   {args: []string{"-retention", "-1h"}, want: "-retention"},
		"zero interval":        {args: []string{"-retention-interval", "0s"}, want: "-retention-interval"},
		"empty prefix token":   {args: []string{"-subject-prefix", "a..b"}, want: "-subject-prefix"},
		"wildcard prefix":      {args: []string{"-subject-prefix", "*"}, want: "-subject-prefix"},
		"unknown log level":    {args: []string{"-log-level", "loud"}, want: "-log-level"},
		"unknown log format":   {args: []string{"-log-format", "xml"}, want: "-log-format"},
		"bad env duration":     {env: map[string]string{"TELEMETRY_RETENTION": "soon"}, want: "TELEMETRY_RETENTION"},
		"negative max bytes":   {args: []string{"-retention-max-bytes", "-5"}, want: "-retention-max-bytes"},
		"stray argument":       {args: []string{"serve"}, want: "unexpected arguments"},
		"negative future skew": {args: []string{"-max-future-skew", "-1s"}, want: "-max-future-skew"},
		"memory limit unit":    {args: []string{"-memory-limit", "lots"}, want: "-memory-limit"},
		"memory limit small":   {args: []string{"-memory-limit", "255MiB"}, want: "-memory-limit 255 MiB is below the minimum 256 MiB"},
		"stream max bytes":     {args: []string{"-stream-max-bytes", "1KiB"}, want: "-stream-max-bytes"},
		"rejected max bytes":   {env: map[string]string{"TELEMETRY_REJECTED_MAX_BYTES": "12QB"}, want: "TELEMETRY_REJECTED_MAX_BYTES"},
		"stream max age":       {args: []string{"-stream-max-age", "0s"}, want: "-stream-max-age"},
		"rollup not dividing":  {args: []string{"-rollups", "7m:90d"}, want: "-rollups: rollup interval 7m: must divide one hour"},
		"rollup no retention":  {args: []string{"-rollups", "1m"}, want: "-rollups: rollup \"1m\": want interval:retention"},
		"rollup bad unit":      {args: []string{"-rollups", "1h:3q"}, want: "-rollups: rollup \"1h:3q\": retention"},
	} {
		t.Run(name, func(t *testing.T) {
			c := DefaultConfig()
			err := c.parseFlags("telemetryd", tc.args, envMap(tc.env), &bytes.Buffer{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// The flags' defaults are the libraries' own, and the prefix rule is
// the ingester's: what one accepts the other accepts.
func TestConfigDefaultsAgreeWithLibraries(t *testing.T) {
	inLane(t, lanes.general)
	c := DefaultConfig()
	sopts := store.DefaultOptions()
	icfg := ingest.DefaultConfig()
	assert.Equal(t, sopts.HotDays, c.HotDays)
	assert.Equal(t, sopts.MaxOpenTables, c.MaxOpenTables)
	assert.Equal(t, icfg.SubjectPrefix, c.SubjectPrefix)
	assert.Equal(t, icfg.Window, buckets.Window{Retention: c.Retention, MaxFutureSkew: c.MaxFutureSkew})
	assert.Equal(t, retention.DefaultInterval, c.RetentionInterval)
	assert.Equal(t, api.DefaultAddr, c.HTTPAddr)
	assert.Equal(t, icfg.StreamMaxAge, c.StreamMaxAge)
	assert.Equal(t, icfg.StreamMaxBytes, c.StreamMaxBytes)
	assert.Equal(t, icfg.RejectedMaxBytes, c.RejectedMaxBytes)

	for _, prefix := range []string{"telemetry", "site1.telemetry", "a.b.c", "a..b", "*", "a.>", "a b", ""} {
		c := DefaultConfig()
		flagErr := c.parseFlags("telemetryd", []string{"-subject-prefix=" + prefix}, envMap(nil), &bytes.Buffer{})
		assert.Equal(t, ingest.ValidateSubjectPrefix(prefix) == nil, flagErr == nil, "prefix %q: %v", prefix, flagErr)
	}
}

func TestEnvName(t *testing.T) {
	inLane(t, lanes.general)
	assert.Equal(t, "TELEMETRY_MAX_FUTURE_SKEW", envName("max-future-skew"))
	assert.Equal(t, "TELEMETRY_NATS_URL", envName("nats-url"))
}
