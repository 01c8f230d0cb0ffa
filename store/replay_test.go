package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/replay"
)

func TestStreamPositionSurvivesReopen(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	_, ok, err := ts.LoadPosition(ctx, "TELEMETRY")
	require.NoError(t, err)
	assert.False(t, ok, "no position before one is saved")

	created := time.Date(2026, 11, 1, 2, 3, 4, 567891234, time.UTC)
	require.NoError(t, ts.SavePosition(ctx, buckets.StreamPosition{Stream: "TELEMETRY", Created: created, Seq: 41}))
	require.NoError(t, ts.SavePosition(ctx, buckets.StreamPosition{Stream: "OTHER", Created: created, Seq: 7}))
	require.NoError(t, ts.SavePosition(ctx, buckets.StreamPosition{Stream: "TELEMETRY", Created: created, Seq: 42}))
	_, err = os.Stat(filepath.Join(ts.dir, replay.PositionsFileName+".tmp"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the temporary file is renamed over the positions file")

	ts = ts.reopen(t)
	p, ok, err := ts.LoadPosition(ctx, "TELEMETRY")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint64(42), p.Seq)
	assert.True(t, created.Equal(p.Created), "creation time kept to the nanosecond: %s", p.Created)
	p, ok, err = ts.LoadPosition(ctx, "OTHER")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint64(7), p.Seq)

	// A damaged file is an error on load and is replaced on save.
	require.NoError(t, os.WriteFile(filepath.Join(ts.dir, replay.PositionsFileName), []byte("{torn"), 0o644))
	_, _, err = ts.LoadPosition(ctx, "TELEMETRY")
	assert.ErrorContains(t, err, replay.PositionsFileName)
	require.NoError(t, ts.SavePosition(ctx, buckets.StreamPosition{Stream: "TELEMETRY", Created: created, Seq: 43}))
	p, _, err = ts.LoadPosition(ctx, "TELEMETRY")
	require.NoError(t, err)
	assert.Equal(t, uint64(43), p.Seq)

	ro := ts.reopen(t, func(o *Options) { o.ReadOnly = true })
	assert.ErrorIs(t, ro.SavePosition(ctx, buckets.StreamPosition{Stream: "TELEMETRY", Seq: 44}), errReadOnly)
}

func TestDropRecordsATombstoneThatSurvivesReopen(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	day := buckets.DayOfTime(baseTime)
	require.NoError(t, ts.Write(ctx, []buckets.Reading{reading("dev-1", at(0), "v", 1.0)}))
	_, ok := ts.DroppedAt(day)
	assert.False(t, ok)

	before := time.Now()
	_, err := ts.DropTable(ctx, day)
	require.NoError(t, err)
	after := time.Now()
	at1, ok := ts.DroppedAt(day)
	require.True(t, ok)
	assert.False(t, at1.Before(before) || at1.After(after), "drop time %s is the wall clock", at1)
	_, ok = ts.DroppedAt(day - 1)
	assert.False(t, ok, "only the dropped day")

	ts = ts.reopen(t)
	at2, ok := ts.DroppedAt(day)
	require.True(t, ok, "tombstone kept across a restart")
	assert.True(t, at1.Equal(at2))
	assert.Equal(t, []buckets.Tombstone{{Day: day, Dropped: at2}}, ts.Tombstones())

	// A later drop of the recreated day moves the tombstone.
	require.NoError(t, ts.Write(ctx, []buckets.Reading{reading("dev-1", at(time.Minute), "v", 2.0)}))
	_, err = ts.DropTable(ctx, day)
	require.NoError(t, err)
	at3, _ := ts.DroppedAt(day)
	assert.True(t, at3.After(at2))
}

// A drop waits for a writer that holds the drop gate before it records
// its tombstone.
func TestHoldDropsDelaysTheTombstone(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	day := buckets.DayOfTime(baseTime)
	require.NoError(t, ts.Write(ctx, []buckets.Reading{reading("dev-1", at(0), "v", 1.0)}))
	release := ts.HoldDrops()
	done := make(chan error, 1)
	go func() {
		_, err := ts.DropTable(ctx, day)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	_, ok := ts.DroppedAt(day)
	assert.False(t, ok, "tombstone recorded while a writer held the gate")
	release()
	require.NoError(t, <-done)
	_, ok = ts.DroppedAt(day)
	assert.True(t, ok)
}

// Without SyncWrites a saved position reaches the positions file only
// after the readings it vouches for were fsynced: written before, a
// power cut could keep the position and lose the readings, and the
// replay after it would start past them.
func TestPositionWaitsForTheSyncOfItsReadings(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t, func(o *Options) { o.SyncWrites, o.SyncEvery = false, time.Hour })
	ctx := context.Background()
	onDisk := func() map[string]replay.Position {
		all, err := replay.ReadPositions(ts.dir)
		require.NoError(t, err)
		return all
	}
	require.NoError(t, ts.Write(ctx, []buckets.Reading{reading("dev-1", at(0), "v", 1.0)}))
	pos := buckets.StreamPosition{Stream: "TELEMETRY_0", Created: baseTime, Seq: 5}
	require.NoError(t, ts.SavePosition(ctx, pos))

	p, ok, err := ts.LoadPosition(ctx, pos.Stream)
	require.NoError(t, err)
	require.True(t, ok, "this process sees the position at once")
	assert.Equal(t, uint64(5), p.Seq)
	assert.NotContains(t, onDisk(), pos.Stream, "not on disk before its reading is fsynced")

	ts.syncAll()
	assert.Equal(t, uint64(5), onDisk()[pos.Stream].Seq, "written by the sync")

	pos.Seq = 6
	require.NoError(t, ts.SavePosition(ctx, pos))
	assert.Equal(t, uint64(5), onDisk()[pos.Stream].Seq)
	require.NoError(t, ts.Close())
	assert.Equal(t, uint64(6), onDisk()[pos.Stream].Seq, "Close syncs and writes what is pending")
}

// A position also waits for the stream: the barrier (the embedded
// server's fsync of its message blocks) runs before the position is
// written, and while it fails the position stays pending.
func TestPositionWaitsForTheStreamBarrier(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t, func(o *Options) { o.SyncWrites, o.SyncEvery = false, time.Hour })
	ctx := context.Background()
	onDisk := func() map[string]replay.Position {
		all, err := replay.ReadPositions(ts.dir)
		require.NoError(t, err)
		return all
	}
	var calls int
	var failing error = errors.New("stream fsync failed")
	var seenAtBarrier []map[string]replay.Position
	ts.SetPositionBarrier(func() error {
		calls++
		seenAtBarrier = append(seenAtBarrier, onDisk())
		return failing
	})
	require.NoError(t, ts.Write(ctx, []buckets.Reading{reading("dev-1", at(0), "v", 1.0)}))
	pos := buckets.StreamPosition{Stream: "TELEMETRY_0", Created: baseTime, Seq: 5}
	require.NoError(t, ts.SavePosition(ctx, pos))

	ts.syncAll()
	assert.Equal(t, 1, calls)
	assert.NotContains(t, onDisk(), pos.Stream, "the stream did not sync: the position stays pending")
	p, ok, err := ts.LoadPosition(ctx, pos.Stream)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint64(5), p.Seq, "still pending")

	failing = nil
	ts.syncAll()
	assert.Equal(t, 2, calls)
	assert.NotContains(t, seenAtBarrier[1], pos.Stream, "the barrier runs before the write")
	assert.Equal(t, uint64(5), onDisk()[pos.Stream].Seq, "written once the stream synced")

	ts.syncAll()
	assert.Equal(t, 2, calls, "nothing pending: no barrier")
}

// Badger's Sync leaves the log of a memtable that filled (and an older
// value log) unsynced until its flush; the sync loop fsyncs every log
// of each writable table and of the index, and their directories,
// before it writes a position.
func TestSyncAllFsyncsEveryLog(t *testing.T) { // not parallel: replaces fsyncFile
	ts := newTestStore(t, func(o *Options) { o.SyncWrites, o.SyncEvery = false, time.Hour })
	ctx := context.Background()
	r := reading("dev-1", at(0), "v", 1.0)
	require.NoError(t, ts.Write(ctx, []buckets.Reading{r}))
	day := r.Day()
	tableDir, indexDir := ts.tableDir(day), filepath.Join(ts.dir, indexDirName)
	// An older log, as Badger leaves one while it flushes a full memtable.
	for _, f := range []string{filepath.Join(tableDir, "09999.mem"), filepath.Join(indexDir, "09999.mem")} {
		require.NoError(t, os.WriteFile(f, nil, 0o644))
	}
	var want []string
	for _, dir := range []string{tableDir, indexDir} {
		for _, pattern := range []string{"*.mem", "*.vlog"} {
			files, err := filepath.Glob(filepath.Join(dir, pattern))
			require.NoError(t, err)
			want = append(want, files...)
		}
		want = append(want, dir)
	}
	var synced []string
	orig := fsyncFile
	fsyncFile = func(p string) error { synced = append(synced, p); return orig(p) }
	defer func() { fsyncFile = orig }()

	require.NoError(t, ts.SavePosition(ctx, buckets.StreamPosition{Stream: "TELEMETRY_0", Created: baseTime, Seq: 1}))
	ts.syncAll()
	assert.Subset(t, synced, want, "every log and both directories")
	assert.Contains(t, synced, filepath.Join(tableDir, "09999.mem"))
	for _, f := range []string{filepath.Join(tableDir, "09999.mem"), filepath.Join(indexDir, "09999.mem")} {
		require.NoError(t, os.Remove(f))
	}
}
