package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets/bucketstest"
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

// TestStartNamesEveryPortInUse: with two ports taken, start-up fails
// naming both flags with their addresses, in the one error it logs,
// before it has written anything to the data dir; a free port is not
// named.
func TestStartNamesEveryPortInUse(t *testing.T) {
	inLane(t, lanes.general)
	httpAddr, mqttAddr := busyPort(t), busyPort(t)
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

// TestStartNamesAnUnusableDataDir: a data dir the service cannot write
// stops start-up with an error naming -data-dir and what to do, not a
// file deep inside it (cursor.key, a table). As root, permissions do
// not stop writes, so the read-only case mounts a read-only tmpfs
// (skipped where mounting is not allowed) and the mode 0500 case runs
// only for other users.
func TestStartNamesAnUnusableDataDir(t *testing.T) {
	inLane(t, lanes.general)
	const fix = "give the user telemetryd runs as write access to it, or choose another directory with -data-dir"
	start := func(t *testing.T, dir string) string {
		t.Helper()
		code, log := runService(t, "-data-dir", dir, "-http-addr", "127.0.0.1:0", "-nats-listen", "127.0.0.1:0", "-mqtt-listen", "")
		require.Equal(t, 1, code, log)
		lines := logLines(log)
		require.NotEmpty(t, lines, log)
		failed := lines[len(lines)-1]
		assert.Equal(t, "start failed", failed.msg, log)
		assert.NotContains(t, log, "cursor", "the error names the dir, not a file inside it")
		return failed.raw
	}
	t.Run("read-only file system", func(t *testing.T) {
		dir := t.TempDir()
		if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_RDONLY, "size=1m"); err != nil {
			t.Skipf("cannot mount a read-only tmpfs here: %v", err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(dir, 0) })
		assert.Contains(t, start(t, dir), "-data-dir "+dir+" is not writable (read-only file system): "+fix)
		sub := filepath.Join(dir, "data")
		assert.Contains(t, start(t, sub), "-data-dir "+sub+" cannot be created (read-only file system): "+fix)
	})
	t.Run("mode 0500", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root writes whatever the mode says")
		}
		dir := t.TempDir()
		require.NoError(t, os.Chmod(dir, 0o500))
		t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
		assert.Contains(t, start(t, dir), "-data-dir "+dir+" is not writable (permission denied): "+fix)
	})
	t.Run("a file", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "data")
		require.NoError(t, os.WriteFile(file, []byte("not a dir"), 0o644))
		assert.Contains(t, start(t, file), "-data-dir "+file+" is a file, not a directory: choose a directory with -data-dir")
		under := filepath.Join(file, "data")
		assert.Contains(t, start(t, under), "-data-dir "+under+" cannot be created (not a directory): "+fix)
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		assert.Equal(t, "not a dir", string(b), "the file is left as it was")
	})
}

// TestStartAfterRestoreLogsCalmly: the first start on a restored data
// dir, whose embedded server's stream is new, reads the stream from its
// beginning and says so at info, with no warning; the same mismatch
// without a restore (the server's store lost) still warns.
func TestStartAfterRestoreLogsCalmly(t *testing.T) {
	inLane(t, lanes.general)
	ctx := context.Background()
	env := func(string) string { return "" }
	cfg := newTestConfig(t)
	cfg.LogLevel = "info"
	s := startService(t, cfg)
	devices := []string{"rs-a", "rs-b", "rs-c", "rs-d"}
	for _, d := range devices {
		s.publish(t, d, fmt.Sprintf(`{"ts":%q,"v":1}`, testEpoch.Add(-time.Minute).Format(time.RFC3339Nano)))
	}
	for _, d := range devices {
		waitFor(t, 20*time.Millisecond, func() bool {
			code, _ := s.get(t, "/v1/devices/"+d, nil)
			return code == http.StatusOK
		}, d)
	}
	s.stop(t) // saves the stream positions

	bdir := t.TempDir()
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"backup", "-data-dir", cfg.DataDir, "-to", bdir}, env, &stdout, &stderr), stderr.String())
	restored, out := restoreBackup(t, bdir)
	require.Contains(t, out, "TELEMETRY_", "the backup carries stream positions")

	startLogged := func(dir string) (*testService, []logLine) {
		t.Helper()
		var buf bucketstest.SyncBuffer
		c := cfg
		c.DataDir = dir
		s := startService(t, c, withLogs(&buf))
		waitFor(t, 10*time.Millisecond, func() bool { return strings.Contains(buf.String(), "msg=consuming") })
		return s, logLines(buf.String())
	}
	s2, lines := startLogged(restored)
	calm := 0
	for _, l := range lines {
		assert.NotEqual(t, "WARN", l.level, l.raw)
		assert.NotEqual(t, "ERROR", l.level, l.raw)
		if strings.HasPrefix(l.msg, "restored data: reading the stream from its beginning") {
			assert.Equal(t, "INFO", l.level, l.raw)
			calm++
		}
	}
	assert.NotZero(t, calm, "no line says the restored data is read from the stream's beginning")
	for _, d := range devices {
		code, out := s2.get(t, "/v1/devices/"+d, nil)
		assert.Equal(t, http.StatusOK, code, "%s: %s", d, out)
	}
	s2.stop(t)

	// Without a restore, a saved position of an earlier stream is
	// unexpected: the embedded server's store was lost.
	require.NoError(t, os.RemoveAll(filepath.Join(cfg.DataDir, "nats")))
	_, lines = startLogged(cfg.DataDir)
	warned := 0
	for _, l := range lines {
		assert.NotContains(t, l.msg, "restored data", l.raw)
		if strings.HasPrefix(l.msg, "saved stream position belongs to an earlier stream") {
			assert.Equal(t, "WARN", l.level, l.raw)
			warned++
		}
	}
	assert.NotZero(t, warned, "the unexpected mismatch warns")
}
