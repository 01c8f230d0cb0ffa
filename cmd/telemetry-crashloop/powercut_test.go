package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/telemetryd/telemetryd/cmd/internal/lazyfs"
)

// lazyFSBinary returns the lazyfs binary named by TELEMETRY_LAZYFS, or
// skips: the power-cut tests need LazyFS built and FUSE (see README.md).
func lazyFSBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("TELEMETRY_LAZYFS")
	if bin == "" {
		t.Skip("set TELEMETRY_LAZYFS to the lazyfs binary to run the power-cut tests (cmd/telemetry-crashloop/README.md)")
	}
	return bin
}

// TestLazyFSCut checks the power cut itself: a write that was fsynced
// survives it, one that was not is gone, also when the file is
// memory-mapped.
func TestLazyFSCut(t *testing.T) {
	l, ctx := mountLazyFS(t)

	synced, unsynced := filepath.Join(l.Mnt, "synced"), filepath.Join(l.Mnt, "unsynced")
	f, err := os.Create(synced)
	require.NoError(t, err)
	_, err = f.WriteString("kept")
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	_, err = f.WriteString(" and lost")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.WriteFile(unsynced, []byte("lost"), 0o644))
	mapped := mapFile(t, filepath.Join(l.Mnt, "mapped"), "kept", "lost")

	require.NoError(t, l.Cut(ctx))

	got, err := os.ReadFile(mapped)
	require.NoError(t, err)
	assert.Equal(t, "kept", string(bytes.TrimRight(got, "\x00")), "msynced data kept, the rest lost")

	got, err = os.ReadFile(synced)
	require.NoError(t, err)
	assert.Equal(t, "kept", string(got))
	got, err = os.ReadFile(unsynced)
	require.NoError(t, err, "LazyFS keeps the file (creation is not cached), not its data")
	assert.Empty(t, got)
}

// TestPowerCutCrashLoop cuts the power under a service that runs with
// -sync-writes three times: every acked reading must survive.
func TestPowerCutCrashLoop(t *testing.T) {
	bin := lazyFSBinary(t)
	cfg := Config{Kills: 3, Readings: 20000, Devices: 10, Batch: 10, Rate: 5000, PowerCut: true, LazyFS: bin,
		Args: []string{"-sync-writes"}, MinUp: 500 * time.Millisecond, MaxUp: 1500 * time.Millisecond, Seed: 4}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	t.Logf("cuts=%d acked=%d stored=%d lost=%d duplicated=%d unexpected=%d failed_starts=%d",
		res.Kills, res.Published, res.Stored, res.Lost, res.Duplicated, res.Unexpected, res.FailedStarts)
	require.NoError(t, err)
	assert.Equal(t, 3, res.Kills)
	assert.Equal(t, cfg.Readings, res.Published)
	assert.Equal(t, cfg.Readings, res.Stored)
	assert.Zero(t, res.Lost)
	assert.Zero(t, res.Duplicated)
	assert.Zero(t, res.Unexpected)
	assert.Zero(t, res.FailedStarts, "the service starts by itself after a power cut")
}

// TestPowerCutBufferedLossBound cuts the power under a service in the
// default, buffered mode, with uptimes longer than its 1 s sync
// interval: a cut may take readings acked in the last interval, none
// acked earlier. It failed while nats-server left the streams' metadata
// unsynced (the streams were skipped at start and read again from their
// beginning) and while a saved stream position could reach the disk
// before the readings it vouched for.
func TestPowerCutBufferedLossBound(t *testing.T) {
	bin := lazyFSBinary(t)
	cfg := Config{Kills: 3, Readings: 30000, Devices: 10, Batch: 10, Rate: 3000, PowerCut: true, LazyFS: bin,
		Args: []string{"-sync-writes=false"}, LossBound: 2 * time.Second, MinUp: 2 * time.Second, MaxUp: 4 * time.Second, Seed: 7}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	t.Logf("cuts=%d acked=%d stored=%d lost=%d (oldest %s at its cut) duplicated=%d failed_starts=%d",
		res.Kills, res.Published, res.Stored, res.Lost, res.maxLostAge(), res.Duplicated, res.FailedStarts)
	require.NoError(t, err)
	assert.Equal(t, 3, res.Kills)
	assert.Equal(t, cfg.Readings, res.Published)
	assert.LessOrEqual(t, res.maxLostAge(), cfg.LossBound)
	assert.Zero(t, res.Duplicated)
	assert.Zero(t, res.Unexpected)
	assert.Zero(t, res.FailedStarts)
}

// TestPowerCutCrashLoopAtomicWrites cuts the power three times under
// line protocol writes that each carry 40 devices' readings, so that
// with -sync-writes each goes into the stream as one atomic batch, fsynced
// once: every reading answered 204 must survive.
func TestPowerCutCrashLoopAtomicWrites(t *testing.T) {
	bin := lazyFSBinary(t)
	cfg := Config{Kills: 3, Readings: 20000, Devices: 40, Batch: 40, Spread: true, Protocol: "lineproto", Rate: 5000,
		PowerCut: true, LazyFS: bin, Args: []string{"-sync-writes"}, MinUp: 500 * time.Millisecond, MaxUp: 1500 * time.Millisecond, Seed: 5}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	t.Logf("cuts=%d acked=%d stored=%d lost=%d duplicated=%d unexpected=%d failed_starts=%d",
		res.Kills, res.Published, res.Stored, res.Lost, res.Duplicated, res.Unexpected, res.FailedStarts)
	require.NoError(t, err)
	assert.Equal(t, 3, res.Kills)
	assert.Equal(t, cfg.Readings, res.Published)
	assert.Equal(t, cfg.Readings, res.Stored)
	assert.Zero(t, res.Lost)
	assert.Zero(t, res.Duplicated)
	assert.Zero(t, res.Unexpected)
}

// mapFile creates a 4 KiB file at path (fsynced), writes kept through a
// shared mapping and msyncs it, then writes lost after it and unmaps it
// without msync, as a memory-mapped write-ahead log would.
func mapFile(t *testing.T, path, kept, lost string) string {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(4096))
	require.NoError(t, f.Sync())
	b, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	copy(b, kept)
	require.NoError(t, unix.Msync(b, unix.MS_SYNC))
	copy(b[len(kept):], lost)
	require.NoError(t, unix.Munmap(b))
	return path
}

// TestLazyFSTornCut checks the torn write itself: of the armed file's
// next write only the first half survives the cut, and what was
// fsynced before it survives too.
func TestLazyFSTornCut(t *testing.T) {
	l, ctx := mountLazyFS(t)

	// A path as long as a stream's message block's: the fault command
	// is longer than the 100 bytes stock LazyFS reads at a time.
	deep := filepath.Join(l.Mnt, "data", "nats", "jetstream", "$G", "streams", "TELEMETRY_12", "msgs")
	require.NoError(t, os.MkdirAll(deep, 0o755))
	path := filepath.Join(deep, "torn")
	f, err := os.Create(path)
	require.NoError(t, err)
	_, err = f.WriteString("kept")
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	writer := make(chan error, 1)
	go func() {
		// Write until the armed fault tears a write and LazyFS is gone.
		for {
			time.Sleep(50 * time.Millisecond)
			if _, err := f.WriteAt([]byte("01234567abcdefgh"), 4); err != nil {
				writer <- err
				return
			}
		}
	}()
	stopped := false
	require.NoError(t, l.TornCut(ctx, []string{path}, func() error { stopped = true; return nil }))
	assert.True(t, stopped)
	assert.Error(t, <-writer, "the writer lost its file system")
	f.Close()
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "kept01234567", string(got), "the fsynced write and the first half of the torn one")
	assert.Contains(t, l.LastTorn(), "torn: will persist 8 bytes from offset 4")
}

// mountLazyFS mounts LazyFS over a temporary directory for the test,
// unmounted at its end, and gives the test two minutes in ctx.
func mountLazyFS(t *testing.T) (l *lazyfs.FS, ctx context.Context) {
	t.Helper()
	dir := t.TempDir()
	l, err := lazyfs.New(lazyFSBinary(t), filepath.Join(dir, "lazyfs"), filepath.Join(dir, "disk"), slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	require.NoError(t, l.Mount(ctx))
	t.Cleanup(func() { l.Close() })
	return l, ctx
}

// TestLazyFSHealth checks what the loop reads of LazyFS: its cache
// fills with unsynced writes and empties at a cut, and a healthy mount,
// cut and unmount leave no unexpected line in its output.
func TestLazyFSHealth(t *testing.T) {
	l, ctx := mountLazyFS(t)
	require.NoError(t, os.WriteFile(filepath.Join(l.Mnt, "unsynced"), make([]byte, 8<<20), 0o644))
	before, err := l.CacheUsage(ctx)
	require.NoError(t, err)
	assert.Greater(t, before, 0.0, "8 MiB written and not synced are in the cache")

	require.NoError(t, l.Cut(ctx))
	after, err := l.CacheUsage(ctx)
	require.NoError(t, err)
	assert.Less(t, after, before, "the cut emptied the cache")

	require.NoError(t, l.Close())
	lines, n := l.OutputFaults(5)
	assert.Zero(t, n, "unexpected lines: %q", lines)
	assert.Len(t, l.Pids(), 2, "two mounts")
	for _, e := range l.Exits() {
		assert.NotEmpty(t, e, "both ended")
	}
}

// TestRestartAfterLazyFSExitsDuringStart: a LazyFS that exits while
// the service starts (it segfaulted so in a 20-cut run) is an unplanned
// cut: the loop mounts again and starts the service, and counts no
// failed start. Before, the start waited out its minute and the next
// tries failed on the ports the hung instance still held.
func TestRestartAfterLazyFSExitsDuringStart(t *testing.T) {
	l, ctx := mountLazyFS(t)
	work := t.TempDir()
	bin, err := buildService(ctx, work)
	require.NoError(t, err)
	cfg := Config{Binary: bin, DataDir: filepath.Join(l.Mnt, "data"), Args: []string{"-sync-writes"}}
	svc, err := newService(cfg, work, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	require.NoError(t, err)
	svc.fsExited = l.Exited
	require.NoError(t, svc.start(ctx))
	require.NoError(t, svc.kill())
	require.NoError(t, l.Cut(ctx))

	// LazyFS dies as the service starts on it.
	pids := l.Pids()
	require.NoError(t, unix.Kill(pids[len(pids)-1], unix.SIGKILL))
	var res Result
	start := time.Now()
	err = restart(ctx, svc, l, &publisher{}, slog.New(slog.NewTextHandler(testWriter{t}, nil)), &res)
	require.NoError(t, err)
	defer svc.stop(15 * time.Second)
	assert.Equal(t, 1, res.LazyFSCrashes, "one unplanned cut")
	require.Len(t, res.Cuts, 1)
	assert.True(t, res.Cuts[0].Unplanned)
	assert.Zero(t, res.FailedStarts)
	assert.Len(t, l.Pids(), 3, "mounted again")
	assert.Less(t, time.Since(start), time.Minute, "the start did not wait out its timeout")
	assert.Equal(t, "synced", svc.durability)
}

// TestLazyFSKeepsOSyncWrites: a write through a file opened with O_SYNC
// (how nats-server writes a consumer's state and a stream's metadata
// when every write is synced: a temporary file, renamed over the old
// one) is on disk when the write returns, so a cut keeps it.
func TestLazyFSKeepsOSyncWrites(t *testing.T) {
	l, ctx := mountLazyFS(t)
	dir := filepath.Join(l.Mnt, "obs")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for i := range 3 {
		tmp := filepath.Join(dir, "o.dat.tmp")
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_SYNC, 0o644)
		require.NoError(t, err)
		_, err = f.WriteString("state " + string(rune('0'+i)))
		require.NoError(t, err)
		require.NoError(t, f.Close())
		require.NoError(t, os.Rename(tmp, filepath.Join(dir, "o.dat")))
	}
	d, err := os.Open(dir)
	require.NoError(t, err)
	require.NoError(t, d.Sync())
	require.NoError(t, d.Close())

	require.NoError(t, l.Cut(ctx))
	got, err := os.ReadFile(filepath.Join(dir, "o.dat"))
	require.NoError(t, err)
	assert.Equal(t, "state 2", string(got), "the last O_SYNC write survives the cut")
}
