package backup_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
	"github.com/telemetryd/telemetryd/store/backup"
	"github.com/telemetryd/telemetryd/store/storetest"
)

// snapshot is everything a user can read of devs, as JSON, so two
// stores compare byte for byte.
func snapshot(t *testing.T, s *store.Store, devs ...string) string {
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

func restoreInto(t *testing.T, from string) (*storetest.Store, backup.Manifest) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	m, err := store.Restore(context.Background(), from, dir, backup.RestoreOptions{})
	require.NoError(t, err)
	return storetest.Open(t, dir, storetest.NewClock()), m
}

func TestBackupIncrementalRestore(t *testing.T) {
	ctx := context.Background()
	// No compaction between the backups: each is to copy only what the
	// test wrote (a merge of today's blocks would be a commit of its own).
	ts := storetest.New(t, func(o *store.Options) { o.CompactInterval = time.Hour })
	old := storetest.Today - 3
	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(old, time.Hour), time.Second, 500)...)
	ts.MustWrite(t, storetest.Series("b", storetest.DayTick(storetest.Today, time.Hour), time.Second, 300)...)
	attrs, verr := buckets.NewAttributes(map[string]string{"fleet": "East"})
	require.Nil(t, verr)
	require.NoError(t, ts.Assign(ctx, []buckets.Assignment{{Device: "a", At: storetest.At(0), Set: attrs}}))
	pos := buckets.StreamPosition{Stream: "TELEMETRY", Created: storetest.BaseTime, Seq: 41}
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
	assert.Equal(t, backup.Progress{Name: storetest.Today.String(), Done: 3, Total: 3, Bytes: m1.Tables[1].Bytes()}, steps[2])
	first := snapshot(t, ts.Store, "a", "b")

	// More writes to storetest.Today only: the next backup copies only them.
	ts.MustWrite(t, storetest.Series("b", storetest.DayTick(storetest.Today, 2*time.Hour), time.Second, 200)...)
	ts.MustWrite(t, storetest.Series("c", storetest.DayTick(storetest.Today, 3*time.Hour), time.Second, 10)...)
	require.NoError(t, ts.SavePosition(ctx, buckets.StreamPosition{Stream: "TELEMETRY", Created: storetest.BaseTime, Seq: 97}))
	m2, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	assert.Equal(t, 2, m2.ID)
	assert.Equal(t, 1, m2.Skipped, "the old day did not change")
	assert.Equal(t, m1.Tables[0].Files, m2.Tables[0].Files, "the old day's chain is the first copy")
	require.Len(t, m2.Tables[1].Files, 2, "storetest.Today: full copy then incremental")
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
	assert.True(t, p.Created.Equal(storetest.BaseTime))
}

// A key list that does not match its manifest makes the next backup
// copy the table in full, and a restore refuses it like any other file.
func TestBackupWithADamagedKeyList(t *testing.T) {
	ctx := context.Background()
	ts := storetest.New(t)
	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(storetest.Today, time.Hour), time.Second, 50)...)
	bdir := t.TempDir()
	m1, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	keys := filepath.Join(bdir, m1.Tables[0].Keys.Path)
	require.NoError(t, os.WriteFile(keys, []byte("damaged"), 0o644))

	dir := filepath.Join(t.TempDir(), "data")
	_, err = store.Restore(ctx, bdir, dir, backup.RestoreOptions{})
	require.ErrorIs(t, err, backup.ErrCorrupt)
	assert.Contains(t, err.Error(), keys)

	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(storetest.Today, 2*time.Hour), time.Second, 50)...)
	m2, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	require.Len(t, m2.Tables[0].Files, 1, "a full copy")
	assert.Zero(t, m2.Tables[0].Files[0].Since)
	want := snapshot(t, ts.Store, "a")
	rs, _ := restoreInto(t, bdir)
	assert.Equal(t, want, snapshot(t, rs.Store, "a"))
}

func TestBackupOfReadOnlyStore(t *testing.T) {
	ctx := context.Background()
	ts := storetest.New(t)
	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(storetest.Today, time.Hour), time.Second, 50)...)
	want := snapshot(t, ts.Store, "a")
	require.NoError(t, ts.Close())
	ro := storetest.Open(t, ts.Dir, ts.Clock, func(o *store.Options) { o.ReadOnly = true })
	bdir := t.TempDir()
	_, err := ro.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	rs, _ := restoreInto(t, bdir)
	assert.Equal(t, want, snapshot(t, rs.Store, "a"))
}

func TestRestoreRefusesCorruptFile(t *testing.T) {
	ctx := context.Background()
	ts := storetest.New(t)
	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(storetest.Today, time.Hour), time.Second, 50)...)
	bdir := t.TempDir()
	m, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	path := filepath.Join(bdir, m.Tables[0].Files[0].Path)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[len(b)/2] ^= 0x40
	require.NoError(t, os.WriteFile(path, b, 0o644))

	dir := filepath.Join(t.TempDir(), "data")
	_, err = store.Restore(ctx, bdir, dir, backup.RestoreOptions{})
	require.ErrorIs(t, err, backup.ErrCorrupt)
	assert.Contains(t, err.Error(), path)
	_, statErr := os.Stat(dir)
	assert.ErrorIs(t, statErr, os.ErrNotExist, "nothing written before the check")

	require.NoError(t, os.Remove(path))
	_, err = store.Restore(ctx, bdir, dir, backup.RestoreOptions{})
	require.ErrorIs(t, err, backup.ErrCorrupt)
	assert.Contains(t, err.Error(), path)
}

func TestRestoreRefusesNonEmptyDir(t *testing.T) {
	ctx := context.Background()
	ts := storetest.New(t)
	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(storetest.Today, time.Hour), time.Second, 5)...)
	bdir := t.TempDir()
	_, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	_, err = store.Restore(ctx, bdir, ts.Dir, backup.RestoreOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not empty")

	_, err = store.Restore(ctx, t.TempDir(), filepath.Join(t.TempDir(), "x"), backup.RestoreOptions{})
	require.Error(t, err, "a directory without a backup")
}

func TestBackupKeepsTombstones(t *testing.T) {
	ctx := context.Background()
	ts := storetest.New(t)
	old := storetest.Today - 2
	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(old, time.Hour), time.Second, 5)...)
	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(storetest.Today, time.Hour), time.Second, 5)...)
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
	ts := storetest.New(t)
	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(storetest.Today, time.Hour), time.Second, 5)...)
	bdir := t.TempDir()
	_, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	leftover := filepath.Join(bdir, backup.ID(2), "tables")
	require.NoError(t, os.MkdirAll(leftover, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(leftover, storetest.Today.String()+".kv"), []byte("torn"), 0o644))
	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(storetest.Today, 2*time.Hour), time.Second, 5)...)
	m, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	assert.Equal(t, 2, m.ID)
	want := snapshot(t, ts.Store, "a")
	rs, _ := restoreInto(t, bdir)
	assert.Equal(t, want, snapshot(t, rs.Store, "a"))
}

// A restore that fails after it began loading leaves the directory
// empty, so it can be retried.
func TestRestoreFailureLeavesNothing(t *testing.T) {
	ts := storetest.New(t)
	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(storetest.Today-1, time.Hour), time.Second, 5)...)
	ts.MustWrite(t, storetest.Series("a", storetest.DayTick(storetest.Today, time.Hour), time.Second, 5)...)
	bdir := t.TempDir()
	_, err := ts.Backup(context.Background(), bdir, backup.Options{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	_, err = store.Restore(ctx, bdir, dir, backup.RestoreOptions{Progress: func(p backup.Progress) {
		if p.Done == 2 {
			cancel()
		}
	}})
	require.ErrorIs(t, err, context.Canceled)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)
	_, err = store.Restore(context.Background(), bdir, dir, backup.RestoreOptions{})
	require.NoError(t, err, "a retry starts over")
}
