package main

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/cmd/internal/lazyfs"
)

// TestLazyFSKeepsFsynced writes as the service does, all at once, on a
// LazyFS with a small cache: appenders that fsync each record (stream
// message blocks), files written, fsynced, renamed and removed (batch
// stores, atomic file writes), files grown by ftruncate (value and
// memtable logs, which fill the cache with zeros). After a cut every
// record an appender fsynced must be there.
func TestLazyFSKeepsFsynced(t *testing.T) {
	bin := lazyFSBinary(t)
	dur := 20 * time.Second
	if s := os.Getenv("TELEMETRY_LAZYFS_STRESS"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err)
		dur = d
	}
	dir := t.TempDir()
	l, err := lazyfs.NewSized(bin, filepath.Join(dir, "lazyfs"), filepath.Join(dir, "disk"), cmpOr(os.Getenv("TELEMETRY_LAZYFS_CACHE"), "64mb"),
		slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, l.Mount(ctx))
	t.Cleanup(func() { l.Close() })

	const appenders, record = 8, 256
	synced := make([]atomic.Int64, appenders)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for a := range appenders {
		wg.Go(func() {
			f, err := os.OpenFile(filepath.Join(l.Mnt, "append-"+strconv.Itoa(a)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			buf := make([]byte, record)
			for n := int64(0); ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				binary.BigEndian.PutUint64(buf, uint64(n))
				if _, err := f.Write(buf); err != nil {
					errs <- err
					return
				}
				if err := f.Sync(); err != nil {
					errs <- fmt.Errorf("fsync append-%d: %w", a, err)
					return
				}
				synced[a].Store(n + 1)
			}
		})
	}
	for c := range 2 {
		wg.Go(func() {
			data := make([]byte, 64<<10)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				d := filepath.Join(l.Mnt, fmt.Sprintf("churn-%d-%d", c, n))
				if err := os.MkdirAll(d, 0o755); err != nil {
					errs <- err
					return
				}
				tmp, final := filepath.Join(d, "f.tmp"), filepath.Join(d, "f")
				if err := writeSyncedFile(tmp, data); err != nil {
					errs <- err
					return
				}
				if err := os.Rename(tmp, final); err != nil {
					errs <- err
					return
				}
				if n > 0 {
					_ = os.RemoveAll(filepath.Join(l.Mnt, fmt.Sprintf("churn-%d-%d", c, n-1)))
				}
			}
		})
	}
	wg.Go(func() {
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			p := filepath.Join(l.Mnt, fmt.Sprintf("grown-%d", n))
			f, err := os.Create(p)
			if err != nil {
				errs <- err
				return
			}
			err = f.Truncate(16 << 20)
			f.Close()
			if err != nil {
				errs <- err
				return
			}
			if n >= 2 {
				_ = os.Remove(filepath.Join(l.Mnt, fmt.Sprintf("grown-%d", n-2)))
			}
		}
	})
	time.Sleep(dur)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Logf("writer error: %v", err)
	}
	usage, err := l.CacheUsage(ctx)
	t.Logf("cache usage before the cut: %.1f%% (%v)", usage, err)
	require.NoError(t, l.Cut(ctx))
	for a := range appenders {
		want := synced[a].Load()
		b, err := os.ReadFile(filepath.Join(l.Mnt, "append-"+strconv.Itoa(a)))
		require.NoError(t, err)
		got := int64(len(b) / record)
		bad := int64(-1)
		for n := range min(got, want) {
			if binary.BigEndian.Uint64(b[n*record:]) != uint64(n) {
				bad = n
				break
			}
		}
		assert.GreaterOrEqual(t, got, want, "append-%d: %d records fsynced, %d after the cut", a, want, got)
		assert.Equal(t, int64(-1), bad, "append-%d: record %d damaged", a, bad)
		t.Logf("append-%d: fsynced %d, after the cut %d", a, want, got)
	}
	lines, n := l.OutputFaults(5)
	t.Logf("lazyfs output: %d unexpected lines %q; kernel: %q", n, lines, l.KernelFaults())
}

func writeSyncedFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
