package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets/linemsg"
)

func TestConfigConnectFlags(t *testing.T) {
	inLane(t, lanes.general)
	c := DefaultConfig()
	require.NoError(t, c.parseFlags("telemetryd", nil, envMap(nil), &bytes.Buffer{}))
	assert.Equal(t, "127.0.0.1:1883", c.MQTTListen)
	assert.Equal(t, "device,host", c.LineDeviceTags)
	mode, err := c.lineTags()
	require.NoError(t, err)
	assert.Equal(t, linemsg.TagsAsAttributes, mode, "tags are attributes by default")
	assert.Equal(t, int64(16<<20), c.MaxWriteBytes)
	tags, err := c.lineDeviceTags()
	require.NoError(t, err)
	assert.Equal(t, []string{"device", "host"}, tags)

	c = DefaultConfig()
	require.NoError(t, c.parseFlags("telemetryd", []string{"-mqtt-listen="},
		envMap(map[string]string{"TELEMETRY_LINE_DEVICE_TAGS": "sensor, node", "TELEMETRY_MAX_WRITE_BYTES": "1024",
			"TELEMETRY_LINE_TAGS": "values"}), &bytes.Buffer{}))
	assert.Empty(t, c.MQTTListen, "an empty -mqtt-listen turns MQTT off")
	tags, err = c.lineDeviceTags()
	require.NoError(t, err)
	assert.Equal(t, []string{"sensor", "node"}, tags)
	assert.Equal(t, int64(1024), c.MaxWriteBytes)
	mode, err = c.lineTags()
	require.NoError(t, err)
	assert.Equal(t, linemsg.TagsAsValues, mode)

	for name, args := range map[string][]string{
		"empty tag":         {"-line-device-tags", "device,,host"},
		"no tag":            {"-line-device-tags", ""},
		"unknown tag mode":  {"-line-tags", "labels"},
		"zero write bytes":  {"-max-write-bytes", "0"},
		"negative bytes":    {"-max-write-bytes", "-1"},
		"bad mqtt port":     {"-mqtt-listen", "127.0.0.1:x"},
		"mqtt without port": {"-mqtt-listen", "127.0.0.1"},
	} {
		t.Run(name, func(t *testing.T) {
			c := DefaultConfig()
			err := c.parseFlags("telemetryd", args, envMap(nil), &bytes.Buffer{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), args[0])
		})
	}
}
