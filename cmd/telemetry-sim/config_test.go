package main

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigDefaults(t *testing.T) {
	c := defaultConfig()
	require.NoError(t, c.parse(nil, envOf(nil), io.Discard))
	assert.Equal(t, defaultConfig(), c)
	assert.Equal(t, "nats://127.0.0.1:4222", c.NATSURL)
	assert.Equal(t, 10, c.Devices)
	assert.Equal(t, 10.0, c.Rate)
	assert.Equal(t, time.Minute, c.Duration)
	assert.Equal(t, 4096, c.MaxPending)
	assert.True(t, c.MsgID)
	assert.False(t, c.Trace)
}

func TestConfigEnvAndFlags(t *testing.T) {
	env := envOf(map[string]string{
		"TELEMETRY_SIM_NATS_URL":    "nats://env:4222",
		"TELEMETRY_SIM_DEVICES":     "7",
		"TELEMETRY_SIM_RATE":        "250.5",
		"TELEMETRY_SIM_MSG_ID":      "false",
		"TELEMETRY_SIM_TRACE":       "true",
		"TELEMETRY_SIM_DURATION":    "0",
		"TELEMETRY_SIM_FORMAT":      "flat",
		"TELEMETRY_SIM_MAX_PENDING": "16",
	})
	c := defaultConfig()
	require.NoError(t, c.parse([]string{"-devices", "3", "-format=nested"}, env, io.Discard))
	assert.Equal(t, "nats://env:4222", c.NATSURL)
	assert.Equal(t, 3, c.Devices, "flag wins over environment")
	assert.Equal(t, "nested", c.Format, "flag wins over environment")
	assert.Equal(t, 250.5, c.Rate)
	assert.False(t, c.MsgID)
	assert.True(t, c.Trace)
	assert.Equal(t, time.Duration(0), c.Duration)
	assert.Equal(t, 16, c.MaxPending)
}

func TestConfigBadEnvNamesVariable(t *testing.T) {
	c := defaultConfig()
	err := c.parse(nil, envOf(map[string]string{"TELEMETRY_SIM_BATCH": "many"}), io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "TELEMETRY_SIM_BATCH")
}

func TestConfigLimits(t *testing.T) {
	tests := []struct {
		args []string
		ok   bool
	}{
		{[]string{"-batch", "1"}, true},
		{[]string{"-batch", "0"}, false},
		{[]string{"-batch", "10000"}, true},
		{[]string{"-batch", "10001"}, false},
		{[]string{"-values", "1"}, true},
		{[]string{"-values", "0"}, false},
		{[]string{"-values", "252"}, true},
		{[]string{"-values", "253"}, false},
		{[]string{"-devices", "1"}, true},
		{[]string{"-devices", "0"}, false},
		{[]string{"-devices", "100000"}, true},
		{[]string{"-devices", "100001"}, false},
		{[]string{"-max-pending", "1"}, true},
		{[]string{"-max-pending", "0"}, false},
		{[]string{"-rate", "0"}, true},
		{[]string{"-rate", "-1"}, false},
		{[]string{"-count", "-1"}, false},
		{[]string{"-duration", "-1s"}, false},
		{[]string{"-seq-start", "0"}, false},
		{[]string{"-format", "flat"}, true},
		{[]string{"-format", "xml"}, false},
		{[]string{"-ts-format", "epoch-ms"}, true},
		{[]string{"-ts-format", "unix"}, false},
		{[]string{"-log-format", "json"}, true},
		{[]string{"-log-format", "yaml"}, false},
		{[]string{"-subject-prefix", "acme_telemetry"}, true},
		{[]string{"-subject-prefix", "acme.telemetry"}, false},
		{[]string{"-subject-prefix", "telemetry.*"}, false},
		{[]string{"-subject-prefix", "telemetry."}, false},
		{[]string{"-subject-prefix", ""}, false},
		{[]string{"-device-prefix", ""}, true},
		{[]string{"-device-prefix", "dev_"}, true},
		{[]string{"-device-prefix", "dev/"}, false},
		{[]string{"-device-prefix", "-x"}, false},
		{[]string{"-device-prefix", "a123456789012345678901234567890123456789012345678901234567890"}, false},
		{[]string{"-device-prefix", "a12345678901234567890123456789012345678901234567890123456789"}, true},
		{[]string{"stray"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.args[0]+" "+tt.args[len(tt.args)-1], func(t *testing.T) {
			c := defaultConfig()
			err := c.parse(tt.args, envOf(nil), io.Discard)
			if tt.ok {
				assert.NoError(t, err)
			} else {
				assert.Error(t, err)
			}
		})
	}
}
