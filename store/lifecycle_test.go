package store

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/devindex"
)

func TestOpenLocksTheDataDirectory(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	_, err := Open(context.Background(), ts.dir, ts.opts)
	require.ErrorIs(t, err, ErrLocked)
	assert.Contains(t, err.Error(), filepath.Join(ts.dir, "LOCK"))

	require.NoError(t, ts.Close())
	s, err := Open(context.Background(), ts.dir, ts.opts)
	require.NoError(t, err, "Close releases the lock")
	require.NoError(t, s.Close())
}

func TestReopenKeepsEverything(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	all := threeDays(t, ts)
	ts.write(t, reading("dev", all[len(all)-1].Ticks, "extra", "merged"))
	devsBefore, _, err := ts.Devices(ctx, buckets.DeviceQuery{Limit: 10})
	require.NoError(t, err)
	tablesBefore, err := ts.Tables(ctx)
	require.NoError(t, err)

	ts = ts.reopen(t)
	got, err := ts.Latest(ctx, "dev", 100)
	require.NoError(t, err)
	want := reversed(all)
	want[0].Values = buckets.Merge(want[0].Values, []buckets.Field{{Name: "extra", Value: buckets.String("merged")}})
	assert.Equal(t, want, got)
	devs, _, err := ts.Devices(ctx, buckets.DeviceQuery{Limit: 10})
	require.NoError(t, err)
	assert.Equal(t, devsBefore, devs)
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, countsOf(tablesBefore), countsOf(tables))
}

func countsOf(tables []buckets.TableInfo) map[buckets.Day]int64 {
	m := make(map[buckets.Day]int64)
	for _, t := range tables {
		m[t.Day] = t.Readings
	}
	return m
}

// tableDamages break a closed day table's directory in several ways.
var tableDamages = map[string]func(t *testing.T, dir string){
	"truncated MANIFEST": func(t *testing.T, dir string) {
		require.NoError(t, os.Truncate(filepath.Join(dir, "MANIFEST"), 3))
	},
	"garbage over the sst files": func(t *testing.T, dir string) {
		ssts, err := filepath.Glob(filepath.Join(dir, "*.sst"))
		require.NoError(t, err)
		require.NotEmpty(t, ssts)
		for _, f := range ssts {
			fi, err := os.Stat(f)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(f, []byte(strings.Repeat("\xff", int(fi.Size()))), 0o644))
		}
	},
	"truncated sst files": func(t *testing.T, dir string) {
		ssts, err := filepath.Glob(filepath.Join(dir, "*.sst"))
		require.NoError(t, err)
		require.NotEmpty(t, ssts)
		for _, f := range ssts {
			fi, err := os.Stat(f)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(f, fi.Size()/2))
		}
	},
	"garbage over every file": func(t *testing.T, dir string) {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			if e.Name() == "LOCK" {
				continue
			}
			garbage := []byte(strings.Repeat("\xde\xad\xbe\xef", 1024))
			require.NoError(t, os.WriteFile(filepath.Join(dir, e.Name()), garbage, 0o644))
		}
	},
}

func TestDamagedTableFailsOnlyItsDay(t *testing.T) {
	t.Parallel()
	for name, breakIt := range tableDamages {
		t.Run(name, func(t *testing.T) {
			ts := newTestStore(t)
			ctx := context.Background()
			all := threeDays(t, ts)
			bad := today - 1
			require.NoError(t, ts.Close())
			breakIt(t, filepath.Join(ts.dir, "tables", bad.String()))

			ts = openTestStore(t, ts.dir, ts.clock, func(o *Options) { *o = ts.opts })
			_, err := ts.Latest(ctx, "dev", 100)
			require.ErrorIs(t, err, buckets.ErrUnavailable)
			assert.Contains(t, err.Error(), bad.String(), "the error names the day")
			_, err = ts.Get(ctx, "dev", all[10].Ticks)
			require.ErrorIs(t, err, buckets.ErrUnavailable)
			err = ts.Write(ctx, []buckets.Reading{reading("dev", dayTick(bad, 23*time.Hour), "v", 1)})
			require.ErrorIs(t, err, buckets.ErrUnavailable)

			// Other days keep working.
			got, err := ts.Latest(ctx, "dev", 10)
			require.NoError(t, err)
			assert.Equal(t, reversed(all)[:10], got)
			p, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: (bad - 1).Start(), To: (bad - 1).End(), Limit: 100})
			require.NoError(t, err)
			assert.Equal(t, reversed(all[:10]), p.Readings)
			ts.write(t, reading("dev", at(time.Minute), "v", 1))

			tables, err := ts.Tables(ctx)
			require.NoError(t, err)
			assert.Equal(t, map[buckets.Day]int64{bad - 1: 16, bad: -1, bad + 1: 17}, countsOf(tables), "a damaged table's count is unknown")

			// The operator can drop it.
			_, err = ts.DropTable(ctx, bad)
			require.NoError(t, err)
			p, err = ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: (bad - 1).Start(), To: (bad + 1).End(), Limit: 100})
			require.NoError(t, err)
			assert.Len(t, p.Readings, 21)
		})
	}
}

func TestColdTablesStayBounded(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t, func(o *Options) { o.MaxOpenTables = 2; o.IdleClose = time.Hour })
	ctx := context.Background()
	for d := today - 6; d <= today; d++ {
		ts.write(t, reading("dev", dayTick(d, time.Hour), "v", int(d)))
	}
	ts = ts.reopen(t)
	assert.Zero(t, ts.openCold(), "Open opens no table")

	for d := today - 6; d < today-1; d++ {
		_, err := ts.Get(ctx, "dev", dayTick(d, time.Hour))
		require.NoError(t, err)
		ts.closeIdle() // the same sweep the open started in the background, run to completion
		assert.Equal(t, min(int(d-(today-6))+1, 2), ts.openCold(), "at most MaxOpenTables cold tables stay open")
		assert.True(t, ts.isOpen(d), "the most recently used stays open")
		if d > today-6 {
			assert.True(t, ts.isOpen(d-1), "at the limit nothing more is closed")
		}
		if d > today-5 {
			assert.False(t, ts.isOpen(d-2), "one past the limit the least recently used is closed")
		}
	}

	// Every day stays readable through reopening.
	got, err := ts.Latest(ctx, "dev", 100)
	require.NoError(t, err)
	assert.Len(t, got, 7)
	require.Eventually(t, func() bool { return ts.openCold() <= 2 }, 5*time.Second, time.Millisecond)
}

func TestIdleColdTablesAreClosed(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t, func(o *Options) { o.IdleClose = 40 * time.Millisecond })
	ctx := context.Background()
	ts.write(t, reading("dev", dayTick(today-4, time.Hour), "v", 1))
	ts.write(t, reading("dev", dayTick(today, time.Hour), "v", 2))
	require.True(t, ts.isOpen(today-4))
	require.True(t, ts.isOpen(today))

	ts.clock.Advance(time.Second)
	require.Eventually(t, func() bool { return !ts.isOpen(today - 4) }, 5*time.Second, 5*time.Millisecond)
	assert.True(t, ts.isOpen(today), "hot tables stay open")

	_, err := ts.Get(ctx, "dev", dayTick(today-4, time.Hour))
	require.NoError(t, err, "a closed table reopens on use")
}

func TestHotAndColdTables(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	for _, d := range []buckets.Day{today - 2, today - 1, today, today + 1} {
		ts.write(t, reading("dev", dayTick(d, 0), "v", 1))
	}
	hot := func(d buckets.Day) bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return ts.tables[d].hot
	}
	assert.False(t, hot(today-2))
	assert.True(t, hot(today-1), "HotDays=2: yesterday is hot")
	assert.True(t, hot(today))
	assert.True(t, hot(today+1), "tomorrow (future skew) is hot")

	// Two days later yesterday is cold: it is closed when idle and
	// reopened with cold options.
	ts.clock.Advance(2 * 24 * time.Hour)
	ts.closeIdleNow(t)
	ts.clock.Advance(ts.opts.IdleClose)
	ts.closeIdleNow(t)
	assert.False(t, ts.isOpen(today-1))
	_, err := ts.Get(ctx, "dev", dayTick(today-1, 0))
	require.NoError(t, err)
	assert.False(t, hot(today-1))
}

func TestDevicesPaging(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	ids := []string{"a", "b-1", "b-2", "b-3", "b2", "c"}
	for i, id := range ids {
		ts.write(t, reading(id, at(time.Duration(i)*time.Second), "v", i))
	}
	tests := []struct {
		prefix string
		after  buckets.DeviceID
		limit  int
		want   []buckets.DeviceID
		more   bool
	}{
		{"", "", 10, []buckets.DeviceID{"a", "b-1", "b-2", "b-3", "b2", "c"}, false},
		{"", "", 6, []buckets.DeviceID{"a", "b-1", "b-2", "b-3", "b2", "c"}, false},
		{"", "", 5, []buckets.DeviceID{"a", "b-1", "b-2", "b-3", "b2"}, true},
		{"b-", "", 2, []buckets.DeviceID{"b-1", "b-2"}, true},
		{"b-", "b-2", 2, []buckets.DeviceID{"b-3"}, false},
		{"b-", "b-1", 2, []buckets.DeviceID{"b-2", "b-3"}, false},
		{"b", "b-3", 5, []buckets.DeviceID{"b2"}, false},
		{"b", "a", 5, []buckets.DeviceID{"b-1", "b-2", "b-3", "b2"}, false},
		{"", "b-15", 1, []buckets.DeviceID{"b-2"}, true}, // after need not exist
		{"", "c", 5, nil, false},
		{"z", "", 5, nil, false},
	}
	for _, tt := range tests {
		infos, more, err := ts.Devices(ctx, buckets.DeviceQuery{Prefix: tt.prefix, After: tt.after, Limit: tt.limit})
		require.NoError(t, err)
		var got []buckets.DeviceID
		for _, in := range infos {
			got = append(got, in.Device)
		}
		assert.Equal(t, tt.want, got, "prefix %q after %q limit %d", tt.prefix, tt.after, tt.limit)
		assert.Equal(t, tt.more, more, "prefix %q after %q limit %d", tt.prefix, tt.after, tt.limit)
	}
	_, _, err := ts.Devices(ctx, buckets.DeviceQuery{Limit: 0})
	assert.ErrorIs(t, err, buckets.ErrInvalidArgument)
}

func TestDevicesTrackSeenTimesAndLatestValues(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	ts.write(t, reading("dev", at(-time.Hour), "temp", 20.0, "hum", 50))
	ts.write(t, reading("dev", at(time.Minute), "temp", 22.0))
	ts.write(t, reading("dev", at(-2*time.Hour), "temp", 10.0, "old", true)) // late: older than last seen
	ts.write(t, reading("dev", at(time.Minute), "temp", 23.0))               // merge at the same time: wins

	want := []buckets.DeviceInfo{{
		Device: "dev", FirstSeen: at(-2 * time.Hour), LastSeen: at(time.Minute),
		Latest: reading("x", 0, "hum", 50, "old", true, "temp", 23.0).Values,
	}}
	infos, _, err := ts.Devices(ctx, buckets.DeviceQuery{Limit: 10})
	require.NoError(t, err)
	assert.Equal(t, want, infos)

	ts = ts.reopen(t)
	infos, _, err = ts.Devices(ctx, buckets.DeviceQuery{Limit: 10})
	require.NoError(t, err)
	assert.Equal(t, want, infos, "the index survives a restart")
}

func TestIndexDayBoundsArePersistedBeforeWriteReturns(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ts.write(t, reading("dev", dayTick(today-1, time.Hour), "v", 1))
	ts.write(t, reading("dev", dayTick(today, time.Hour), "v", 2))
	// Read the index database directly: no flush has run yet.
	first, last := persistedBounds(t, ts, "dev")
	assert.Equal(t, dayTick(today-1, time.Hour), first)
	assert.Equal(t, dayTick(today, time.Hour), last)
}

// persistedBounds loads the records of ts's index database as they are
// on disk and returns dev's first and last reading time.
func persistedBounds(t *testing.T, ts *testStore, dev string) (first, last buckets.Ticks) {
	t.Helper()
	x, err := devindex.Load(ts.index.DB(), true, quietLogger())
	require.NoError(t, err)
	first, last, ok := x.Bounds(buckets.DeviceID(dev))
	require.True(t, ok)
	return first, last
}

func TestPing(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	require.NoError(t, ts.Ping(context.Background()))
	require.NoError(t, ts.Close())
	assert.ErrorIs(t, ts.Ping(context.Background()), buckets.ErrUnavailable)
	_, err := ts.Latest(context.Background(), "dev", 1)
	assert.ErrorIs(t, err, buckets.ErrUnavailable)
}

func TestLostIndexIsRebuiltFromTables(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	all := threeDays(t, ts)
	devsBefore, _, err := ts.Devices(ctx, buckets.DeviceQuery{Limit: 10})
	require.NoError(t, err)
	require.NoError(t, ts.Close())
	require.NoError(t, os.RemoveAll(filepath.Join(ts.dir, "index")))

	ts = openTestStore(t, ts.dir, ts.clock, func(o *Options) { *o = ts.opts })
	got, err := ts.Latest(ctx, "dev", 100)
	require.NoError(t, err)
	assert.Equal(t, reversed(all), got)
	devs, _, err := ts.Devices(ctx, buckets.DeviceQuery{Limit: 10})
	require.NoError(t, err)
	assert.Equal(t, devsBefore, devs)
}

func TestReadOnlyChangesNothingOnDisk(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(context.Background(), dir, DefaultOptions())
	require.NoError(t, err)
	day := buckets.DayOfTime(time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC))
	r := buckets.Reading{Device: "dev-1", Ticks: day.Start() + 5, Values: []buckets.Field{{Name: "v", Value: buckets.Int(1)}}}
	require.NoError(t, s.Write(context.Background(), []buckets.Reading{r}))
	require.NoError(t, s.Close())

	before := dirSnapshot(t, dir)
	opts := DefaultOptions()
	opts.ReadOnly = true
	ro, err := Open(context.Background(), dir, opts)
	require.NoError(t, err)
	tables, err := ro.Tables(context.Background())
	require.NoError(t, err)
	require.Len(t, tables, 1)
	assert.Equal(t, int64(1), tables[0].Readings)
	got, err := ro.Get(context.Background(), "dev-1", r.Ticks)
	require.NoError(t, err)
	assert.Equal(t, r.Values, got.Values)
	assert.Error(t, ro.Write(context.Background(), []buckets.Reading{r}))
	_, err = ro.DropTable(context.Background(), day)
	assert.Error(t, err)
	require.NoError(t, ro.Close())
	assert.Equal(t, before, dirSnapshot(t, dir), "a read-only store changes nothing on disk")

	// A read-only opener still respects a writer's lock.
	w, err := Open(context.Background(), dir, DefaultOptions())
	require.NoError(t, err)
	defer w.Close()
	_, err = Open(context.Background(), dir, opts)
	assert.ErrorIs(t, err, ErrLocked)
}

// dirSnapshot maps every file under dir to its size and modification time.
func dirSnapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[p] = fmt.Sprintf("%d %s", info.Size(), info.ModTime())
		return nil
	}))
	return out
}
