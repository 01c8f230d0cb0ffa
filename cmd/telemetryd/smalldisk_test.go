package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/cmd/internal/diskfit"
)

// TestStartOnASmallDisk: on a 300 MB file system, a service with the
// default sizes starts, having fitted the streams and the disk reserve
// to it and said so; one told to keep a 4 GiB stream there refuses to
// start, naming the flag and the free space.
func TestStartOnASmallDisk(t *testing.T) {
	inLane(t, lanes.general)
	disk := mountSmallFS(t, 300<<20)

	t.Run("defaults are fitted", func(t *testing.T) {
		cfg := newTestConfig(t)
		cfg.DataDir = filepath.Join(disk, "fit")
		var logs lockedBuffer
		m := openMain(t, cfg, &logs, testClock())
		assert.Contains(t, logs.String(), "small disk")
		assert.Contains(t, logs.String(), "-stream-max-bytes")
		assert.Contains(t, logs.String(), "-disk-reserve")
		assert.Less(t, m.cfg.StreamMaxBytes+m.cfg.RejectedMaxBytes+diskfit.MQTTStreams*m.cfg.MQTTStreamMaxBytes, int64(300<<20)/2+1)
		assert.LessOrEqual(t, m.cfg.DiskReserve, int64(300<<20)/8)

		s := &testService{Main: m, cfg: m.cfg, base: "http://" + m.HTTPAddr()}
		s.waitReady(t)
		code, body := s.get(t, "/readyz", nil)
		assert.Equal(t, 200, code, body)
		require.NoError(t, m.Close(context.Background()))
	})
	t.Run("a set size that does not fit is refused", func(t *testing.T) {
		cfg := newTestConfig(t)
		cfg.DataDir = filepath.Join(disk, "refuse")
		cfg.StreamMaxBytes = 4 << 30
		cfg.set = map[string]bool{"stream-max-bytes": true} // as -stream-max-bytes 4GiB does
		m := NewMain(cfg, newLogger(cfg, &bytes.Buffer{}), func(string) string { return "" })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := m.Open(ctx)
		_ = m.Close(context.Background())
		require.Error(t, err)
		assert.Contains(t, err.Error(), "-stream-max-bytes 4GiB")
		assert.Contains(t, err.Error(), "free under "+filepath.Join(disk, "refuse"))
		assert.False(t, strings.Contains(err.Error(), "insufficient storage"), err.Error())
	})
}
