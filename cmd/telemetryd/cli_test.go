package main

import (
	"bytes"
	"context"
	"flag"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/cmd/internal/flagdoc"
	"github.com/telemetryd/telemetryd/store"
)

func TestHelpShowsSubcommandsFlagsAndEnvironment(t *testing.T) {
	inLane(t, lanes.general)
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"-h"}, envMap(nil), &stdout, &stderr))
	help := stderr.String()
	assert.Contains(t, help, "telemetryd retention [-dry-run] [flags]", "the subcommand is listed")
	assert.Contains(t, help, "-version")
	assert.Contains(t, help, "OTEL_")
	all := flag.NewFlagSet("", flag.ContinueOnError)
	cfg := DefaultConfig()
	cfg.bind(all)
	fleet, tuning := flagdoc.Split(all)
	fleet.VisitAll(func(f *flag.Flag) {
		assert.Contains(t, help, "  -"+f.Name+" ", "flag -%s is listed", f.Name)
		assert.Contains(t, help, "["+envName(f.Name)+"]", "variable of -%s is listed", f.Name)
	})
	tuning.VisitAll(func(f *flag.Flag) {
		assert.NotContains(t, help, "  -"+f.Name+" ", "tuning setting -%s is not listed", f.Name)
	})
	assert.Contains(t, help, `"Tuning"`, "-h points to the tuning settings")
	assert.Contains(t, help, `(default "./data")`)
}

func TestRetentionHelpListsOnlyItsFlags(t *testing.T) {
	inLane(t, lanes.general)
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"retention", "-h"}, envMap(nil), &stdout, &stderr))
	help := stderr.String()
	for _, f := range []string{"dry-run", "data-dir", "retention", "retention-max-bytes", "log-level", "log-format"} {
		assert.Contains(t, help, "  -"+f+" ", "retention -h lists -%s", f)
	}
	for _, f := range []string{"http-addr", "nats-url", "nats-listen", "subject-prefix", "hot-days", "sync-writes", "mqtt-listen"} {
		assert.NotContains(t, help, "  -"+f+" ", "retention -h does not list the service flag -%s", f)
	}
	// A service flag is not accepted by the subcommand either.
	stderr.Reset()
	assert.Equal(t, 2, run(context.Background(), []string{"retention", "-http-addr", ":1"}, envMap(nil), &stdout, &stderr))
	assert.Contains(t, stderr.String(), "flag provided but not defined: -http-addr")
}

func TestVersion(t *testing.T) {
	inLane(t, lanes.general)
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"-version"}, envMap(nil), &stdout, &stderr))
	assert.True(t, strings.HasPrefix(stdout.String(), "telemetryd "), stdout.String())
	assert.Contains(t, stdout.String(), runtime.Version())
	assert.Empty(t, stderr.String())
}

// startErr opens a service for cfg and returns its start error.
func startErr(t *testing.T, cfg Config) error {
	t.Helper()
	m := NewMain(cfg, newLogger(cfg, testLogWriter(t)), envMap(nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := m.Open(ctx)
	require.NoError(t, m.Close(context.Background()))
	require.Error(t, err)
	return err
}

// busyPort holds a loopback port for the test.
func busyPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// Start errors carry each prefix once, and a busy port fails at once,
// named by its flag.
func TestStartErrorsNameEachPartOnce(t *testing.T) {
	inLane(t, lanes.general)
	t.Run("data dir in use", func(t *testing.T) {
		cfg := newTestConfig(t)
		st, err := store.Open(context.Background(), cfg.DataDir, store.Options{})
		require.NoError(t, err)
		defer st.Close()
		err = startErr(t, cfg)
		assert.Equal(t, 1, strings.Count(err.Error(), "open store"), err.Error())
	})
	t.Run("http port busy", func(t *testing.T) {
		cfg := newTestConfig(t)
		cfg.HTTPAddr = busyPort(t)
		err := startErr(t, cfg)
		assert.True(t, strings.HasPrefix(err.Error(), "-http-addr "+cfg.HTTPAddr+": address already in use"), err.Error())
		assert.NotContains(t, err.Error(), "api:", "checked before the API opens")
	})
	t.Run("nats port busy", func(t *testing.T) {
		cfg := newTestConfig(t)
		cfg.NATSListen = busyPort(t)
		cfg.MQTTListen = ""
		err := startErr(t, cfg)
		assert.True(t, strings.HasPrefix(err.Error(), "-nats-listen "+cfg.NATSListen+": address already in use"), err.Error())
		assert.NotContains(t, err.Error(), "not ready after", "a busy port fails on the server's bind error, not the ready timeout")
	})
}
