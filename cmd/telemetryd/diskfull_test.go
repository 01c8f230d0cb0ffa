package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mountSmallFS mounts a tmpfs of size bytes for the test, or skips when
// the test cannot mount (not root, or no permission in a container).
func mountSmallFS(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the disk-full test mounts a small tmpfs and needs root")
	}
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("cannot mount a tmpfs here: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// freeBytes is what the file system of dir has available.
func freeBytes(t *testing.T, dir string) int64 {
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(dir, &st))
	return int64(st.Bavail) * int64(st.Bsize)
}

// When the data dir's file system fills up, ingest stops acking,
// /readyz says why, nothing is lost, and once space returns it resumes
// by itself and stores every reading exactly once.
func TestDiskFullPausesAndResumes(t *testing.T) {
	inLane(t, lanes.general)
	data := mountSmallFS(t, 160<<20)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true}) // the stream keeps the backlog on another disk
	require.NoError(t, err)
	ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)

	cfg := newTestConfig(t)
	cfg.DataDir = filepath.Join(data, "data")
	cfg.NATSURL = ns.ClientURL()
	cfg.MQTTListen = ""
	cfg.MemoryLimit = 256 << 20
	cfg.DiskReserve = 24 << 20
	s := startService(t, cfg)
	ctx := context.Background()

	publish := func(from, n int) {
		for i := from; i < from+n; i++ {
			ts := testEpoch.Add(-time.Hour + time.Duration(i)*time.Millisecond).UnixMilli()
			s.publish(t, "dev-d", fmt.Sprintf(`{"ts":%d,"v":%d}`, ts, i))
		}
	}
	publish(0, 100)
	waitStored(t, s, "dev-d", 100)

	// Fill the file system to below the reserve.
	filler, err := os.Create(filepath.Join(data, "filler"))
	require.NoError(t, err)
	chunk := make([]byte, 1<<20)
	for freeBytes(t, data) > 8<<20 {
		_, err := filler.Write(chunk)
		require.NoError(t, err)
	}
	require.NoError(t, filler.Close())
	var body string
	waitFor(t, 50*time.Millisecond, func() bool {
		var code int
		code, body = s.get(t, "/readyz", nil)
		return code == http.StatusServiceUnavailable
	}, "/readyz does not report the full disk")
	assert.Contains(t, body, "disk full")

	publish(100, 200)
	time.Sleep(2 * time.Second)
	c, err := s.js.Consumer(ctx, "TELEMETRY", "ingest")
	require.NoError(t, err)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, info.NumPending+uint64(info.NumAckPending), uint64(200), "not acked while the disk is full")
	assert.Len(t, pageAll(t, s, "dev-d", "asc", 1000, url.Values{}), 100, "nothing new stored while full")

	// Space returns: ingest resumes by itself.
	require.NoError(t, os.Remove(filepath.Join(data, "filler")))
	waitFor(t, 50*time.Millisecond, func() bool {
		code, _ := s.get(t, "/readyz", nil)
		return code == http.StatusOK
	})
	waitStored(t, s, "dev-d", 300)
	got := pageAll(t, s, "dev-d", "asc", 1000, url.Values{})
	require.Len(t, got, 300, "every reading stored exactly once")
	rej, err := s.js.Stream(ctx, "TELEMETRY_REJECTED")
	require.NoError(t, err)
	assert.Zero(t, rej.CachedInfo().State.Msgs, "nothing dead-lettered")
}
