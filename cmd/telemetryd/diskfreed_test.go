package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fillDisk writes a file under dir until the file system refuses more.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	require.NoError(t, err)
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	for n := 64 << 10; n >= 512; n /= 2 { // the last few blocks
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				break
			}
		}
	}
	require.NoError(t, f.Close())
	return path
}

// TestFullDiskFreedRecoversWithoutRestart: the embedded server's
// streams and the day tables share a 300 MB file system. Filled to
// the last byte, /readyz fails and publishes are refused or time out;
// once the filler is removed, publishes succeed again within seconds
// (twice over),
// without a restart, /readyz is 200 and every acked reading is stored.
func TestFullDiskFreedRecoversWithoutRestart(t *testing.T) {
	inLane(t, lanes.general)
	disk := mountSmallFS(t, 300<<20)
	cfg := newTestConfig(t)
	cfg.DataDir = filepath.Join(disk, "data")
	cfg.MQTTListen = ""
	s := startService(t, cfg)

	pad := strings.Repeat("x", 4000)
	acked := 0
	publish := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		ts := testEpoch.Add(-time.Hour + time.Duration(acked)*time.Millisecond).UnixMilli()
		_, err := s.js.Publish(ctx, cfg.SubjectPrefix+".dev-f", fmt.Appendf(nil, `{"ts":%d,"n":%d,"pad":%q}`, ts, acked, pad))
		if err == nil {
			acked++
		}
		return err
	}
	for range 50 {
		require.NoError(t, publish(5*time.Second))
	}
	waitStored(t, s, "dev-f", 50)

	for cycle := range 2 { // the second time too: recovery leaves nothing behind
		filler := fillDisk(t, disk)
		var failed error
		for range 200 { // until JetStream meets the full disk
			if failed = publish(time.Second); failed != nil {
				break
			}
		}
		require.Error(t, failed, "cycle %d: a publish failed once the disk was full", cycle)
		code, body := s.readyz(t)
		assert.Equal(t, http.StatusServiceUnavailable, code, "cycle %d: /readyz while the disk is full: %s", cycle, body)

		require.NoError(t, os.Remove(filler))
		freed := time.Now()
		waitFor(t, 100*time.Millisecond, func() bool { return publish(time.Second) == nil },
			"cycle %d: publishes still fail after the space came back", cycle)
		t.Logf("cycle %d: first publish acked %s after the space came back", cycle, time.Since(freed).Round(time.Millisecond))
	}
	for range 50 {
		require.NoError(t, publish(5*time.Second))
	}
	s.waitReady(t)
	waitStored(t, s, "dev-f", acked)
}
