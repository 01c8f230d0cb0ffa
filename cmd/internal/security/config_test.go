package security

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/cmd/internal/cursorkey"
)

func TestCursorKeyPerInstallation(t *testing.T) {
	dir := t.TempDir()
	sec := Default()
	k1, err := sec.LoadCursorKey(dir)
	require.NoError(t, err)
	k2, err := sec.LoadCursorKey(dir)
	require.NoError(t, err)
	assert.Equal(t, k1, k2, "the key survives restarts")
	st, err := os.Stat(filepath.Join(dir, cursorkey.File))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	other, err := sec.LoadCursorKey(t.TempDir())
	require.NoError(t, err)
	assert.NotEqual(t, k1, other, "each installation has its own")
	sec.CursorKey = strings.Repeat("k", 32)
	k3, err := sec.LoadCursorKey(dir)
	require.NoError(t, err)
	assert.Equal(t, []byte(sec.CursorKey), k3, "-cursor-key wins")
}

func TestIsLoopbackAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "[::1]:4222": true, "localhost:1883": true, "LocalHost:1": true,
		"[::ffff:127.0.0.1]:80": true, ":8080": false, "0.0.0.0:8080": false, "10.0.0.1:80": false,
		"example.com:80": false, "127.0.0.1": false,
	} {
		assert.Equal(t, want, IsLoopbackAddr(addr), addr)
	}
}

func TestValidate(t *testing.T) {
	loop := []Listener{{Flag: "-http-addr", Addr: "127.0.0.1:8080"}}
	open := []Listener{{Flag: "-http-addr", Addr: ":8080"}}
	require.NoError(t, Default().Validate("", loop))

	err := Default().Validate("", open)
	assert.ErrorContains(t, err, `-http-addr ":8080" listens beyond loopback without credentials`)
	c := Default()
	c.Insecure = true
	assert.NoError(t, c.Validate("", open))
	c = Default()
	c.AuthFile = "auth.json"
	assert.NoError(t, c.Validate("", open))

	for name, tc := range map[string]struct {
		mod  func(*Config)
		url  string
		want string
	}{
		"cert without key": {mod: func(c *Config) { c.TLSCert = "c.pem" }, want: "-tls-cert and -tls-key go together"},
		"negative rate":    {mod: func(c *Config) { c.HTTPRate = -1 }, want: "must not be negative"},
		"short cursor key": {mod: func(c *Config) { c.CursorKey = strings.Repeat("k", 31) }, want: "-cursor-key has 31 characters; use at least 32"},
		"creds and user":   {mod: func(c *Config) { c.NATSCreds, c.NATSUser, c.NATSPassword = "f", "u", "p" }, url: "nats://x:4222", want: "exclude each other"},
		"user no password": {mod: func(c *Config) { c.NATSUser = "u" }, url: "nats://x:4222", want: "-nats-user and -nats-password go together"},
		"creds no url":     {mod: func(c *Config) { c.NATSCreds = "f" }, want: "need -nats-url"},
	} {
		t.Run(name, func(t *testing.T) {
			c := Default()
			tc.mod(&c)
			assert.ErrorContains(t, c.Validate(tc.url, loop), tc.want)
		})
	}
	ok := Default()
	ok.CursorKey = strings.Repeat("k", 32)
	assert.NoError(t, ok.Validate("", loop), "at the limits")
}
