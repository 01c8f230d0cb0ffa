package clustercfg

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ownership"
)

const cursorKey = "0123456789abcdef0123456789abcdef"

func valid() Config {
	c := Default()
	c.Partitions, c.NodeName, c.AdvertiseURL = 12, "node-1", "http://node-1:8080"
	return c
}

func TestValidate(t *testing.T) {
	off := Default()
	require.NoError(t, off.Validate("", ""), "a single node needs nothing")
	c := valid()
	require.NoError(t, c.Validate("nats://n:4222", cursorKey))

	c.NodeName = ""
	require.NoError(t, c.Validate("nats://n:4222", cursorKey))
	assert.NotEmpty(t, c.NodeName, "an empty node name becomes the host name")

	for name, tc := range map[string]struct {
		mod      func(*Config)
		url, key string
		want     string
	}{
		"no nats url":         {mod: func(*Config) {}, key: cursorKey, want: "needs -nats-url"},
		"no cursor key":       {mod: func(*Config) {}, url: "nats://n:4222", want: "needs -cursor-key"},
		"copies 0":            {mod: func(c *Config) { c.Copies = 0 }, want: "-copies 0: want 1 to 5"},
		"copies 6":            {mod: func(c *Config) { c.Copies = 6 }, want: "-copies 6: want 1 to 5"},
		"replicas 6":          {mod: func(c *Config) { c.StreamReplicas = 6 }, want: "-stream-replicas 6: want 1 to 5"},
		"short lease":         {mod: func(c *Config) { c.LeaseTTL = ownership.MinLeaseTTL - time.Millisecond }, want: "-lease-ttl"},
		"advertise no host":   {mod: func(c *Config) { c.AdvertiseURL = "http://" }, want: "-advertise-url"},
		"advertise scheme":    {mod: func(c *Config) { c.AdvertiseURL = "ftp://node-1" }, want: "-advertise-url"},
		"short token":         {mod: func(c *Config) { c.ClusterToken = "short" }, want: "-cluster-token has 5 characters; use at least 16"},
		"bad node name":       {mod: func(c *Config) { c.NodeName = "a b" }, want: "-node-name"},
		"negative partitions": {mod: func(c *Config) { c.Partitions = -1 }, want: "-partitions"},
	} {
		t.Run(name, func(t *testing.T) {
			c := valid()
			tc.mod(&c)
			url, key := tc.url, tc.key
			if url == "" && key == "" {
				url, key = "nats://n:4222", cursorKey
			}
			assert.ErrorContains(t, c.Validate(url, key), tc.want)
		})
	}
	at := valid()
	at.Copies, at.StreamReplicas, at.LeaseTTL, at.ClusterToken = 5, 5, ownership.MinLeaseTTL, strings.Repeat("c", 16)
	assert.NoError(t, at.Validate("nats://n:4222", cursorKey), "at the limits")
}

// A cluster has a stream per partition unless told otherwise; the flag
// says nothing to a single node, which validates with the default.
func TestPartitionStreamsDefault(t *testing.T) {
	assert.True(t, Default().PartitionStreams)
	off := Default()
	require.NoError(t, off.Validate("", ""))
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	c := valid()
	c.Bind(fs)
	assert.Equal(t, "true", fs.Lookup("partition-streams").DefValue)
	require.NoError(t, fs.Parse([]string{"-partition-streams=false"}))
	assert.False(t, c.PartitionStreams)
	require.NoError(t, c.Validate("nats://n:4222", cursorKey))
}

func TestCredential(t *testing.T) {
	c := valid()
	derived, err := c.Credential(cursorKey)
	require.NoError(t, err)
	assert.Len(t, derived, 64)
	assert.NotContains(t, derived, cursorKey)
	again, err := c.Credential(cursorKey)
	require.NoError(t, err)
	assert.Equal(t, derived, again, "every node with the same cursor key derives the same credential")
	other, err := c.Credential(strings.Repeat("k", 32))
	require.NoError(t, err)
	assert.NotEqual(t, derived, other)
	c.ClusterToken = strings.Repeat("c", 32)
	given, err := c.Credential(cursorKey)
	require.NoError(t, err)
	assert.Equal(t, c.ClusterToken, given, "-cluster-token wins")
}
