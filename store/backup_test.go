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
	"github.com/telemetryd/telemetryd/store/versions"
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

// A table compacted between backups (its open blocks deleted and merged)
// restores to the same answers: the incremental copy carries deletions.
func TestBackupIncrementalAfterCompaction(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// tableKeys lists the live keys of the table of day with their values.
func tableKeys(t *testing.T, s *Store, day buckets.Day) map[string]string {
	t.Helper()
	tb, err := s.acquire(context.Background(), day, forRead)
	require.NoError(t, err)
	defer s.release(tb)
	out := map[string]string{}
	require.NoError(t, versions.ViewLatest(tb.db, func(txn *badger.Txn) error {
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

func TestBackupMetrics(t *testing.T) {
	t.Parallel()
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
