package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/proto"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/backup"
)

// snapshot is everything a user can read of devs, as JSON, so two
// stores compare byte for byte.
func snapshot(t *testing.T, s *Store, devs ...string) string {
	t.Helper()
	ctx := context.Background()
	out := map[string]any{}
	for _, d := range devs {
		p, err := s.Range(ctx, buckets.RangeQuery{Device: buckets.DeviceID(d), From: 0, To: buckets.Ticks(1) << 62, Order: buckets.Asc, Limit: 1 << 20})
		require.NoError(t, err)
		out["range/"+d] = p
		latest, err := s.Latest(ctx, buckets.DeviceID(d), 3)
		require.NoError(t, err)
		out["latest/"+d] = latest
	}
	infos, _, err := s.Devices(ctx, buckets.DeviceQuery{Limit: 1000})
	require.NoError(t, err)
	out["devices"] = infos
	tables, err := s.Tables(ctx)
	require.NoError(t, err)
	for i := range tables {
		tables[i].SizeBytes = 0
	}
	out["tables"] = tables
	b, err := json.Marshal(out)
	require.NoError(t, err)
	return string(b)
}

func restoreInto(t *testing.T, from string) (*testStore, backup.Manifest) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	m, err := Restore(context.Background(), from, dir, backup.RestoreOptions{})
	require.NoError(t, err)
	return openTestStore(t, dir, newTestClock()), m
}

func TestBackupIncrementalRestore(t *testing.T) {
	ctx := context.Background()
	ts := newTestStore(t)
	old := today - 3
	ts.write(t, series("a", dayTick(old, time.Hour), time.Second, 500)...)
	ts.write(t, series("b", dayTick(today, time.Hour), time.Second, 300)...)
	attrs, verr := buckets.NewAttributes(map[string]string{"fleet": "East"})
	require.Nil(t, verr)
	require.NoError(t, ts.Assign(ctx, []buckets.Assignment{{Device: "a", At: at(0), Set: attrs}}))
	pos := buckets.StreamPosition{Stream: "TELEMETRY", Created: baseTime, Seq: 41}
	require.NoError(t, ts.SavePosition(ctx, pos))

	bdir := t.TempDir()
	var steps []backup.Progress
	m1, err := ts.Backup(ctx, bdir, backup.Options{Progress: func(p backup.Progress) { steps = append(steps, p) }})
	require.NoError(t, err)
	assert.Equal(t, 1, m1.ID)
	require.Len(t, m1.Tables, 2)
	assert.Equal(t, 5, m1.CopiedFiles) // index, both tables and their key lists
	assert.Equal(t, uint64(41), m1.Positions["TELEMETRY"].Seq)
	assert.Equal(t, map[string]uint64{"TELEMETRY": 41}, m1.Sequences())
	assert.Equal(t, m1.Index.Bytes()+m1.Tables[0].Bytes()+m1.Tables[1].Bytes(), m1.TotalBytes())
	require.NotNil(t, m1.Tables[0].Keys)
	require.NotNil(t, m1.Tables[1].Keys)
	assert.Equal(t, m1.CopiedBytes, m1.TotalBytes()+m1.Tables[0].Keys.Size+m1.Tables[1].Keys.Size,
		"a first backup copies all it holds, and the key lists")
	require.Len(t, steps, 3)
	assert.Equal(t, backup.Progress{Name: today.String(), Done: 3, Total: 3, Bytes: m1.Tables[1].Bytes()}, steps[2])
	first := snapshot(t, ts.Store, "a", "b")

	// More writes to today only: the next backup copies only them.
	ts.write(t, series("b", dayTick(today, 2*time.Hour), time.Second, 200)...)
	ts.write(t, series("c", dayTick(today, 3*time.Hour), time.Second, 10)...)
	require.NoError(t, ts.SavePosition(ctx, buckets.StreamPosition{Stream: "TELEMETRY", Created: baseTime, Seq: 97}))
	m2, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	assert.Equal(t, 2, m2.ID)
	assert.Equal(t, 1, m2.Skipped, "the old day did not change")
	assert.Equal(t, m1.Tables[0].Files, m2.Tables[0].Files, "the old day's chain is the first copy")
	require.Len(t, m2.Tables[1].Files, 2, "today: full copy then incremental")
	inc := m2.Tables[1].Files[1]
	assert.Equal(t, m1.Tables[1].Version, inc.Since)
	assert.Less(t, m2.CopiedBytes, m1.CopiedBytes+m2.Tables[1].Files[1].Size)
	_, err = os.Stat(filepath.Join(bdir, "000002", "tables", old.String()+".kv"))
	assert.ErrorIs(t, err, os.ErrNotExist, "unchanged table not copied")

	// A third backup with nothing new copies nothing but the manifest.
	m3, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	assert.Equal(t, 2, m3.Skipped)
	assert.Equal(t, m2.Tables, m3.Tables, "no table copied")
	require.Len(t, m2.Index.Files, 1, "the device index is copied in full")
	assert.Equal(t, "000002/index.kv", m2.Index.Files[0].Path)
	assert.Equal(t, m2.Index, m3.Index, "the device index did not change")
	assert.Zero(t, m3.CopiedFiles)

	want := snapshot(t, ts.Store, "a", "b", "c")
	require.NotEqual(t, first, want)
	rs, m := restoreInto(t, bdir)
	assert.Equal(t, 3, m.ID)
	assert.Equal(t, want, snapshot(t, rs.Store, "a", "b", "c"))
	p, ok, err := rs.LoadPosition(ctx, "TELEMETRY")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint64(97), p.Seq)
	assert.True(t, p.Created.Equal(baseTime))
}

// A table compacted between backups (its open blocks deleted and merged)
// restores to the same answers: the incremental copy carries deletions.
func TestBackupIncrementalAfterCompaction(t *testing.T) {
	ctx := context.Background()
	ts := newTestStore(t)
	for i := range 20 {
		ts.write(t, series("a", dayTick(today, time.Hour)+buckets.Ticks(i)*buckets.TicksPerSecond*10, time.Second, 3)...)
	}
	bdir := t.TempDir()
	_, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	ts.write(t, series("a", dayTick(today, 3*time.Hour), time.Second, 5)...)
	ts.compactAll(true)
	_, err = ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	want := snapshot(t, ts.Store, "a")
	wantKeys := tableKeys(t, ts.Store, today)
	rs, _ := restoreInto(t, bdir)
	assert.Equal(t, want, snapshot(t, rs.Store, "a"))
	assert.Equal(t, wantKeys, tableKeys(t, rs.Store, today), "the blocks merged away are gone from the restore too")
}

// The open blocks written after a backup and merged by the compactor
// before the next one were never in a backup: the incremental copy
// leaves their deletions out, and carries the deletions of the blocks
// the earlier backup holds.
func TestIncrementalBackupLeavesOutDeletionsOfNewBlocks(t *testing.T) {
	ctx := context.Background()
	ts := newTestStore(t)
	for i := range 10 {
		ts.write(t, series("a", dayTick(today, time.Hour)+buckets.Ticks(i)*buckets.TicksPerSecond*10, time.Second, 3)...)
	}
	bdir := t.TempDir()
	m1, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	since := m1.Tables[0].Version
	for i := range 30 {
		ts.write(t, series("a", dayTick(today, 2*time.Hour)+buckets.Ticks(i)*buckets.TicksPerSecond*10, time.Second, 3)...)
	}
	ts.compactAll(true)
	m2, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.Len(t, m2.Tables[0].Files, 2)
	inc := m2.Tables[0].Files[1]
	var deleted, live int
	readBackupFile(t, filepath.Join(bdir, inc.Path), func(kv *pb.KV) {
		ref, ok := parseBlockKey(kv.Key, len("a/"))
		if !ok {
			return
		}
		if len(kv.Meta) > 0 && kv.Meta[0]&badgerDeleteMeta != 0 {
			deleted++
			assert.LessOrEqual(t, ref.seq, since, "deletion of a block written after the first backup")
		} else {
			live++
		}
	})
	assert.Positive(t, deleted, "the blocks of the first backup that were merged")
	assert.Positive(t, live)

	want := snapshot(t, ts.Store, "a")
	wantKeys := tableKeys(t, ts.Store, today)
	rs, _ := restoreInto(t, bdir)
	assert.Equal(t, want, snapshot(t, rs.Store, "a"))
	assert.Equal(t, wantKeys, tableKeys(t, rs.Store, today))
}

// badgerDeleteMeta is the meta bit of a deletion marker in Badger's
// backup format (bitDelete in Badger).
const badgerDeleteMeta = 1

// readBackupFile calls f with every entry of a backup file.
func readBackupFile(t *testing.T, path string, f func(kv *pb.KV)) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for len(b) > 0 {
		require.GreaterOrEqual(t, len(b), 8)
		n := binary.LittleEndian.Uint64(b)
		require.LessOrEqual(t, n, uint64(len(b)-8))
		var list pb.KVList
		require.NoError(t, proto.Unmarshal(b[8:8+n], &list))
		for _, kv := range list.Kv {
			f(kv)
		}
		b = b[8+n:]
	}
}

// Badger drops a deletion marker together with the value it deletes
// once no reader needs them (here the compaction of level 0 when the
// table closes): the blocks merged after a backup must still be gone
// from a restore of the next one.
func TestIncrementalBackupAfterDeletionsWereCompactedAway(t *testing.T) {
	ctx := context.Background()
	// No background compaction: the blocks of 3h and 4h are due for a
	// merge, which between the backup and the key listing below would
	// change the keys the restore is compared with.
	ts := newTestStore(t, func(o *Options) { o.CompactInterval = time.Hour })
	for i := range 20 {
		ts.write(t, series("a", dayTick(today, time.Hour)+buckets.Ticks(i)*buckets.TicksPerSecond*10, time.Second, 3)...)
	}
	bdir := t.TempDir()
	_, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	ts.write(t, series("a", dayTick(today, 3*time.Hour), time.Second, 5)...)
	ts.compactAll(true)
	ts = ts.reopen(t)
	ts.write(t, series("a", dayTick(today, 4*time.Hour), time.Second, 5)...)
	m, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.Len(t, m.Tables[0].Files, 2)
	want := snapshot(t, ts.Store, "a")
	wantKeys := tableKeys(t, ts.Store, today)
	rs, _ := restoreInto(t, bdir)
	assert.Equal(t, want, snapshot(t, rs.Store, "a"))
	assert.Equal(t, wantKeys, tableKeys(t, rs.Store, today), "the merged blocks are gone from the restore")
}

// A key list that does not match its manifest makes the next backup
// copy the table in full, and a restore refuses it like any other file.
func TestBackupWithADamagedKeyList(t *testing.T) {
	ctx := context.Background()
	ts := newTestStore(t)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 50)...)
	bdir := t.TempDir()
	m1, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	keys := filepath.Join(bdir, m1.Tables[0].Keys.Path)
	require.NoError(t, os.WriteFile(keys, []byte("damaged"), 0o644))

	dir := filepath.Join(t.TempDir(), "data")
	_, err = Restore(ctx, bdir, dir, backup.RestoreOptions{})
	require.ErrorIs(t, err, backup.ErrCorrupt)
	assert.Contains(t, err.Error(), keys)

	ts.write(t, series("a", dayTick(today, 2*time.Hour), time.Second, 50)...)
	m2, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.Len(t, m2.Tables[0].Files, 1, "a full copy")
	assert.Zero(t, m2.Tables[0].Files[0].Since)
	want := snapshot(t, ts.Store, "a")
	rs, _ := restoreInto(t, bdir)
	assert.Equal(t, want, snapshot(t, rs.Store, "a"))
}

// tableKeys lists the live keys of the table of day with their values.
func tableKeys(t *testing.T, s *Store, day buckets.Day) map[string]string {
	t.Helper()
	tb, err := s.acquire(context.Background(), day, forRead)
	require.NoError(t, err)
	defer s.release(tb)
	out := map[string]string{}
	require.NoError(t, viewLatest(tb.db, func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.DefaultIteratorOptions)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out[string(it.Item().Key())] = string(v)
		}
		return nil
	}))
	return out
}

func TestBackupOfReadOnlyStore(t *testing.T) {
	ctx := context.Background()
	ts := newTestStore(t)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 50)...)
	want := snapshot(t, ts.Store, "a")
	require.NoError(t, ts.Close())
	ro := openTestStore(t, ts.dir, ts.clock, func(o *Options) { o.ReadOnly = true })
	bdir := t.TempDir()
	_, err := ro.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	rs, _ := restoreInto(t, bdir)
	assert.Equal(t, want, snapshot(t, rs.Store, "a"))
}

func TestRestoreRefusesCorruptFile(t *testing.T) {
	ctx := context.Background()
	ts := newTestStore(t)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 50)...)
	bdir := t.TempDir()
	m, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	path := filepath.Join(bdir, m.Tables[0].Files[0].Path)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[len(b)/2] ^= 0x40
	require.NoError(t, os.WriteFile(path, b, 0o644))

	dir := filepath.Join(t.TempDir(), "data")
	_, err = Restore(ctx, bdir, dir, backup.RestoreOptions{})
	require.ErrorIs(t, err, backup.ErrCorrupt)
	assert.Contains(t, err.Error(), path)
	_, statErr := os.Stat(dir)
	assert.ErrorIs(t, statErr, os.ErrNotExist, "nothing written before the check")

	require.NoError(t, os.Remove(path))
	_, err = Restore(ctx, bdir, dir, backup.RestoreOptions{})
	require.ErrorIs(t, err, backup.ErrCorrupt)
	assert.Contains(t, err.Error(), path)
}

func TestRestoreRefusesNonEmptyDir(t *testing.T) {
	ctx := context.Background()
	ts := newTestStore(t)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 5)...)
	bdir := t.TempDir()
	_, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	_, err = Restore(ctx, bdir, ts.dir, backup.RestoreOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not empty")

	_, err = Restore(ctx, t.TempDir(), filepath.Join(t.TempDir(), "x"), backup.RestoreOptions{})
	require.Error(t, err, "a directory without a backup")
}

func TestBackupKeepsTombstones(t *testing.T) {
	ctx := context.Background()
	ts := newTestStore(t)
	old := today - 2
	ts.write(t, series("a", dayTick(old, time.Hour), time.Second, 5)...)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 5)...)
	_, err := ts.DropTable(ctx, old)
	require.NoError(t, err)
	bdir := t.TempDir()
	m, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.Len(t, m.Tables, 1)
	rs, _ := restoreInto(t, bdir)
	_, dropped := rs.DroppedAt(old)
	assert.True(t, dropped)
}

// A backup interrupted before its manifest (a killed process) leaves a
// subdirectory that the next backup replaces.
func TestBackupAfterAnInterruptedOne(t *testing.T) {
	ctx := context.Background()
	ts := newTestStore(t)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 5)...)
	bdir := t.TempDir()
	_, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	leftover := filepath.Join(bdir, backup.ID(2), "tables")
	require.NoError(t, os.MkdirAll(leftover, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(leftover, today.String()+".kv"), []byte("torn"), 0o644))
	ts.write(t, series("a", dayTick(today, 2*time.Hour), time.Second, 5)...)
	m, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	assert.Equal(t, 2, m.ID)
	want := snapshot(t, ts.Store, "a")
	rs, _ := restoreInto(t, bdir)
	assert.Equal(t, want, snapshot(t, rs.Store, "a"))
}

func TestBackupMetrics(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	ts := newTestStore(t, func(o *Options) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	m := collectMetrics(t, reader)
	assert.Zero(t, gaugeValue(t, m, "telemetry.store.backup.last_success"))
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 5)...)
	bdir := t.TempDir()
	man, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(bdir, "MANIFEST.json"), []byte("{"), 0o644))
	_, err = ts.Backup(ctx, bdir, backup.Options{})
	require.Error(t, err, "a damaged manifest stops the next backup")

	m = collectMetrics(t, reader)
	assert.Greater(t, gaugeValue(t, m, "telemetry.store.backup.last_success"), int64(0))
	assert.Equal(t, man.CopiedBytes, counterValue(m, "telemetry.store.backup.copied"))
	byOutcome := map[string]int64{}
	for _, dp := range m["telemetry.store.backups"].(metricdata.Sum[int64]).DataPoints {
		v, _ := dp.Attributes.Value("outcome")
		byOutcome[v.AsString()] = dp.Value
	}
	assert.Equal(t, map[string]int64{"ok": 1, "failed": 1}, byOutcome)
}

// A restore that fails after it began loading leaves the directory
// empty, so it can be retried.
func TestRestoreFailureLeavesNothing(t *testing.T) {
	ts := newTestStore(t)
	ts.write(t, series("a", dayTick(today-1, time.Hour), time.Second, 5)...)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 5)...)
	bdir := t.TempDir()
	_, err := ts.Backup(context.Background(), bdir, backup.Options{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	_, err = Restore(ctx, bdir, dir, backup.RestoreOptions{Progress: func(p backup.Progress) {
		if p.Done == 2 {
			cancel()
		}
	}})
	require.ErrorIs(t, err, context.Canceled)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)
	_, err = Restore(context.Background(), bdir, dir, backup.RestoreOptions{})
	require.NoError(t, err, "a retry starts over")
}
