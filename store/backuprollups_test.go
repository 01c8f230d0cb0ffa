package store

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/backup"
	"github.com/telemetryd/telemetryd/store/rollup"
)

// rollupDump is every rollup bucket of devs on every level, and the
// periods on disk, as JSON, so two stores compare byte for byte.
func rollupDump(t *testing.T, s *Store, devs ...buckets.DeviceID) string {
	t.Helper()
	ctx := context.Background()
	out := map[string]any{}
	var periods []string
	for _, p := range s.RollupPeriods() {
		periods = append(periods, rollup.PeriodName(p))
	}
	out["periods"] = periods
	for i, l := range s.rollups.set.Levels() {
		for _, dev := range devs {
			var bs []rollup.Bucket
			require.NoError(t, s.rollups.set.Scan(ctx, i, dev, 0, buckets.Ticks(1)<<60, func(b rollup.Bucket) error {
				bs = append(bs, b)
				return nil
			}))
			out[l.Name()+"/"+string(dev)] = bs
			for d := today - 200; d <= today; d++ {
				m, err := s.rollups.set.Mark(i, dev, d)
				require.NoError(t, err)
				if m >= 0 {
					out[l.Name()+"/"+string(dev)+"/mark/"+d.String()] = m
				}
			}
		}
	}
	b, err := json.Marshal(out)
	require.NoError(t, err)
	return string(b)
}

// restoreRollups restores the newest backup in from into a new data
// directory and opens it with rollups on.
func restoreRollups(t *testing.T, from string) (*testStore, backup.Manifest) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	m, err := Restore(context.Background(), from, dir, backup.RestoreOptions{})
	require.NoError(t, err)
	return openTestStore(t, dir, newTestClock(), withRollups), m
}

// writeRollupHours writes hours of devs from the start of day, one
// reading a minute, compacting after each hour so that it is rolled up.
func writeRollupHours(t *testing.T, ts *testStore, day buckets.Day, hours int, devs ...string) {
	h := buckets.Ticks(time.Hour / 100)
	k0 := day.Start() + 5*buckets.TicksPerSecond
	for i := range hours {
		for _, dev := range devs {
			ts.write(t, rollupSeries(dev, k0+buckets.Ticks(i)*h, time.Minute, i*60, 60)...)
		}
		ts.compactAll(false)
	}
}

// TestBackupRestoresRollups: the rollups, also of a day whose table is
// gone, are in a backup and a restore brings them back as they were,
// with progress for each period database.
func TestBackupRestoresRollups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	old := today - 40 // another month
	writeRollupHours(t, ts, old, 3, "a", "b")
	_, err := ts.DropTable(ctx, old)
	require.NoError(t, err)
	writeRollupHours(t, ts, today, 3, "a", "b")
	want := rollupDump(t, ts.Store, "a", "b")
	require.Contains(t, want, `"periods":["1m/2026-10","1m/2026-11","1h/2026-01"]`)

	bdir := t.TempDir()
	var steps []string
	m, err := ts.Backup(ctx, bdir, backup.Options{Progress: func(p backup.Progress) {
		steps = append(steps, p.Name)
		assert.Equal(t, 5, p.Total)
		if p.Name == "rollups/1m/2026-11" {
			assert.Positive(t, p.Bytes)
		}
	}})
	require.NoError(t, err)
	assert.Equal(t, []string{"index", today.String(), "rollups/1m/2026-10", "rollups/1m/2026-11", "rollups/1h/2026-01"}, steps)
	require.Len(t, m.Rollups, 3)
	assert.Equal(t, 2, m.Format, "a manifest with rollups is refused by builds without them")
	for _, r := range m.Rollups {
		require.Len(t, r.Files, 1, r.Rollup)
		require.NotNil(t, r.Keys, r.Rollup)
		assert.Equal(t, "000001/rollups/"+r.Rollup+".kv", r.Files[0].Path)
	}
	assert.Equal(t, m.Index.Bytes()+m.Tables[0].Bytes()+m.Rollups[0].Bytes()+m.Rollups[1].Bytes()+m.Rollups[2].Bytes(), m.TotalBytes())

	var loaded []string
	dir := filepath.Join(t.TempDir(), "data")
	_, err = Restore(ctx, bdir, dir, backup.RestoreOptions{Progress: func(p backup.Progress) { loaded = append(loaded, p.Name) }})
	require.NoError(t, err)
	assert.Equal(t, steps, loaded)
	rs := openTestStore(t, dir, newTestClock(), withRollups)
	assert.Equal(t, want, rollupDump(t, rs.Store, "a", "b"))
	h := buckets.Ticks(time.Hour / 100)
	p, err := rs.Aggregate(ctx, buckets.AggregateQuery{Device: "a", From: old.Start(), To: old.End(), Interval: h, Limit: 100})
	require.NoError(t, err)
	assert.Len(t, p.Buckets, 3, "the dropped day's hours come from the restored rollups")
}

// TestRestoreRefusesADamagedRollup names the rollup file that does not
// match the manifest, and writes nothing.
func TestRestoreRefusesADamagedRollup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	writeRollupHours(t, ts, today, 2, "a")
	bdir := t.TempDir()
	m, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.NotEmpty(t, m.Rollups)
	path := filepath.Join(bdir, m.Rollups[0].Files[0].Path)
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
}

// TestIncrementalBackupCarriesARewrittenRollup: a late reading that
// merges a rolled-up window again rewrites its rollup record; the next
// backup copies only what changed, and a restore holds the new value.
func TestIncrementalBackupCarriesARewrittenRollup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	writeRollupHours(t, ts, today, 3, "a", "b")
	bdir := t.TempDir()
	m1, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)

	ts.write(t, reading("a", today.Start()+7*buckets.TicksPerSecond, "temp", 1000.0))
	ts.compactAll(false)
	want := rollupDump(t, ts.Store, "a", "b")
	m2, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.Len(t, m2.Rollups, len(m1.Rollups))
	for i, r := range m2.Rollups {
		require.Len(t, r.Files, 2, "%s: full copy then incremental", r.Rollup)
		assert.Equal(t, m1.Rollups[i].Files[0], r.Files[0])
		assert.Equal(t, m1.Rollups[i].Version, r.Files[1].Since)
		assert.Less(t, r.Files[1].Size, r.Files[0].Size, "%s: the incremental copy holds the rewritten record only", r.Rollup)
	}

	rs, _ := restoreRollups(t, bdir)
	assert.Equal(t, want, rollupDump(t, rs.Store, "a", "b"))
	h := buckets.Ticks(time.Hour / 100)
	n := 0
	require.NoError(t, rs.rollups.set.Scan(ctx, 1, "a", today.Start(), today.Start()+h, func(b rollup.Bucket) error {
		n++
		for _, v := range b.Values {
			if v.Name == "temp" {
				assert.Equal(t, int64(61), v.Summary.Count)
				assert.Equal(t, 1000.0, v.Summary.Max)
			}
		}
		return nil
	}))
	assert.Equal(t, 1, n)

	// Nothing new: the third backup copies no rollup.
	m3, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	assert.Equal(t, m2.Rollups, m3.Rollups)
}

// TestRestoreLeavesOutADroppedRollupPeriod: a period retention dropped
// between two backups is not in the restore of the second.
func TestRestoreLeavesOutADroppedRollupPeriod(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	old := today - 130 // its 1m month is past the 90 days
	writeRollupHours(t, ts, old, 2, "a")
	_, err := ts.DropTable(ctx, old)
	require.NoError(t, err)
	writeRollupHours(t, ts, today, 2, "a")
	bdir := t.TempDir()
	m1, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.Len(t, m1.Rollups, 3)

	n, err := ts.DropExpiredRollups(ctx, ts.clock.Now())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	want := rollupDump(t, ts.Store, "a")
	require.Contains(t, want, `"periods":["1m/2026-11","1h/2026-01"]`)
	m2, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.Len(t, m2.Rollups, 2)

	rs, _ := restoreRollups(t, bdir)
	assert.Equal(t, want, rollupDump(t, rs.Store, "a"))
	_, err = os.Stat(filepath.Join(rs.dir, rollupsDirName, "1m", "2026-07"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// TestRestoreLeavesOutADeletedDevicesRollups: the incremental backup
// after a device delete deletes its rollups and marks in the restore.
func TestRestoreLeavesOutADeletedDevicesRollups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	writeRollupHours(t, ts, today, 3, "a", "b")
	bdir := t.TempDir()
	_, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	_, err = ts.DeleteDevice(ctx, "a")
	require.NoError(t, err)
	want := rollupDump(t, ts.Store, "a", "b")
	m2, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	for _, r := range m2.Rollups {
		require.Len(t, r.Files, 2, "%s: full copy then incremental", r.Rollup)
	}

	rs, _ := restoreRollups(t, bdir)
	assert.Equal(t, want, rollupDump(t, rs.Store, "a", "b"))
	for i := range rs.rollups.set.Levels() {
		n := 0
		require.NoError(t, rs.rollups.set.Scan(ctx, i, "a", 0, buckets.Ticks(1)<<60, func(rollup.Bucket) error { n++; return nil }))
		assert.Zero(t, n, "level %d", i)
		m, err := rs.rollups.set.Mark(i, "a", today)
		require.NoError(t, err)
		assert.Equal(t, buckets.Ticks(-1), m)
	}
	assert.NotContains(t, want, `"1h/b":null`)
}

// TestBackupOfReadOnlyStoreKeepsRollups: a backup of a stopped data
// directory (a read-only store, whose rollups are not open) holds them.
func TestBackupOfReadOnlyStoreKeepsRollups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	writeRollupHours(t, ts, today, 2, "a")
	want := rollupDump(t, ts.Store, "a")
	require.NoError(t, ts.Close())
	ro := openTestStore(t, ts.dir, ts.clock, withRollups, func(o *Options) { o.ReadOnly = true })
	bdir := t.TempDir()
	m, err := ro.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.Len(t, m.Rollups, 2)
	rs, _ := restoreRollups(t, bdir)
	assert.Equal(t, want, rollupDump(t, rs.Store, "a"))
}

// TestBackupWithRollupsOffHasNone: with rollups off the manifest lists
// no rollup, as before.
func TestBackupWithRollupsOffHasNone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 50)...)
	bdir := t.TempDir()
	m, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	assert.Empty(t, m.Rollups)
	assert.Equal(t, 1, m.Format, "as before the rollups")
	b, err := os.ReadFile(filepath.Join(bdir, "MANIFEST.json"))
	require.NoError(t, err)
	assert.NotContains(t, string(b), "rollup")
	_, err = os.Stat(filepath.Join(bdir, "000001", rollupsDirName))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// TestIncrementalRollupBackupAfterADeleteAndARestart: a device delete
// commits only deletions; once closing compacted them away with what
// they deleted, the period's versions must still go on above it after
// the reopen, or the next incremental backup (from the delete's
// version) would miss the records written at the versions given out
// again.
func TestIncrementalRollupBackupAfterADeleteAndARestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	writeRollupHours(t, ts, today, 2, "a", "b")
	bdir := t.TempDir()
	_, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	_, err = ts.DeleteDevice(ctx, "a")
	require.NoError(t, err)
	_, err = ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)

	ts = ts.reopen(t, withRollups) // closing compacts level 0: the deletions go with the records
	writeRollupHours(t, ts, today, 4, "c")
	want := rollupDump(t, ts.Store, "a", "b", "c")
	_, err = ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	rs, _ := restoreRollups(t, bdir)
	assert.Equal(t, want, rollupDump(t, rs.Store, "a", "b", "c"))
}

// TestRestoreRefusesABadRollupName: a manifest whose rollup is not
// <level>/YYYY-MM (a path out of the data directory, a level that is
// not an interval, a day for a month) is refused, naming it, before
// anything is written.
func TestRestoreRefusesABadRollupName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	writeRollupHours(t, ts, today, 2, "a")
	bdir := t.TempDir()
	m, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.Equal(t, "1m/2026-11", m.Rollups[0].Rollup)
	good, err := os.ReadFile(filepath.Join(bdir, "MANIFEST.json"))
	require.NoError(t, err)
	for _, bad := range []string{"../../1m/2026-11", "1m/../2026-11", "1x/2026-11", "1m/2026-11-22", "1m", "1m/2026-13"} {
		data := strings.Replace(string(good), `"rollup": "1m/2026-11"`, `"rollup": "`+bad+`"`, 1)
		require.NotEqual(t, string(good), data)
		require.NoError(t, os.WriteFile(filepath.Join(bdir, "MANIFEST.json"), []byte(data), 0o644))
		dir := filepath.Join(t.TempDir(), "data")
		_, err := Restore(ctx, bdir, dir, backup.RestoreOptions{})
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), `"`+bad+`"`)
		_, statErr := os.Stat(dir)
		assert.ErrorIs(t, statErr, os.ErrNotExist, bad)
	}
	require.NoError(t, os.WriteFile(filepath.Join(bdir, "MANIFEST.json"), good, 0o644))
	_, err = Restore(ctx, bdir, filepath.Join(t.TempDir(), "data"), backup.RestoreOptions{})
	require.NoError(t, err)
}

// TestIncrementalRollupBackupCopiesTheRewrittenHour measures what the
// rollups cost a backup (OPERATIONS.md quotes it; -v prints it): ten
// devices, 30 hours at one reading a minute, the first 24 of them a day
// whose table was dropped; then one late reading. The incremental copy
// holds the rewritten hour's records, not the period again.
func TestIncrementalRollupBackupCopiesTheRewrittenHour(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	devs := make([]string, 10)
	for i := range devs {
		devs[i] = fmt.Sprintf("dev-%02d", i)
	}
	writeRollupHours(t, ts, today-1, 24, devs...)
	_, err := ts.DropTable(ctx, today-1)
	require.NoError(t, err)
	writeRollupHours(t, ts, today, 6, devs...)
	bdir := t.TempDir()
	m1, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	ts.write(t, reading("dev-03", today.Start()+7*buckets.TicksPerSecond, "temp", 1000.0))
	ts.compactAll(false)
	m2, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.Len(t, m2.Rollups, 2)
	for i, r := range m2.Rollups {
		require.Len(t, r.Files, 2, r.Rollup)
		full, inc := m1.Rollups[i].Files[0].Size, r.Files[1].Size
		t.Logf("rollup %s: full copy %d bytes (key list %d), incremental %d bytes (key list %d)",
			r.Rollup, full, m1.Rollups[i].Keys.Size, inc, r.Keys.Size)
		assert.Less(t, inc*10, full, r.Rollup)
	}
}
