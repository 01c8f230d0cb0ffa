package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runService runs `telemetryd args...` as main does, with an empty
// environment, until it returns or ctx ends; it returns the exit code
// and stderr, where the log goes.
func runService(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, func(string) string { return "" }, &stdout, &stderr)
	return code, stderr.String()
}

// holdPort listens on a loopback port for the rest of the test.
func holdPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// TestStartNamesEveryPortInUse: with two ports taken, start-up fails
// naming both flags with their addresses, in the one error it logs,
// before it has written anything to the data dir; a free port is not
// named.
func TestStartNamesEveryPortInUse(t *testing.T) {
	httpAddr, mqttAddr := holdPort(t), holdPort(t)
	pprofAddr := freeLoopback(t)
	dir := t.TempDir()
	code, log := runService(t, "-data-dir", dir, "-http-addr", httpAddr, "-nats-listen", "127.0.0.1:0",
		"-mqtt-listen", mqttAddr, "-pprof-addr", pprofAddr)
	require.Equal(t, 1, code, log)
	lines := logLines(log)
	require.NotEmpty(t, lines, log)
	failed := lines[len(lines)-1]
	assert.Equal(t, "ERROR", failed.level, log)
	assert.Equal(t, "start failed", failed.msg, log)
	assert.Contains(t, failed.raw, "-http-addr "+httpAddr+": address already in use", log)
	assert.Contains(t, failed.raw, "-mqtt-listen "+mqttAddr+": address already in use", log)
	assert.Contains(t, failed.raw, "; -mqtt-listen", "both on the one line: %s", log)
	assert.NotContains(t, failed.raw, "-pprof-addr", "a free port is not named")
	assert.NotContains(t, failed.raw, "-nats-listen", "a random port is not named")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written before the ports are checked")

	// The same port for two listeners is caught too.
	same := freeLoopback(t)
	code, log = runService(t, "-data-dir", dir, "-http-addr", same, "-nats-listen", "127.0.0.1:0",
		"-mqtt-listen", "", "-pprof-addr", same)
	require.Equal(t, 1, code, log)
	assert.Contains(t, log, "-pprof-addr "+same+": address already in use", log)
	assert.NotContains(t, log, "-http-addr "+same, log)
}
