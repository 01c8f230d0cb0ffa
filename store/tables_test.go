package store

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func TestTablesSizesAndExactCounts(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	ts.write(t, series("a", dayTick(today-3, time.Hour), time.Second, 100)...)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 40)...)
	ts.write(t, series("b", dayTick(today, time.Hour), time.Second, 2)...)
	// Merges and redeliveries must not count again.
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 40)...)
	ts.write(t, reading("a", dayTick(today, time.Hour), "extra", true))

	want := []struct {
		day      buckets.Day
		readings int64
	}{{today - 3, 100}, {today, 42}}
	check := func(ts *testStore) {
		t.Helper()
		tables, err := ts.Tables(ctx)
		require.NoError(t, err)
		require.Len(t, tables, len(want))
		for i, w := range want {
			assert.Equal(t, w.day, tables[i].Day, "ascending by day")
			assert.Equal(t, w.readings, tables[i].Readings)
			assert.Positive(t, tables[i].SizeBytes)
			assert.Less(t, tables[i].SizeBytes, int64(64<<20), "preallocated sparse files do not count")
		}
	}
	check(ts)
	check(ts.reopen(t)) // counts come from the tables after a restart
}

func TestTablesSizeGrowsWithData(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	ts.write(t, reading("a", dayTick(today-5, time.Hour), "v", 1))
	rs := series("big", dayTick(today-4, time.Hour), time.Second, 5000)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range rs {
		rs[i].Values[0].Value = buckets.Float(rng.Float64()) // noise does not compress
	}
	ts.write(t, rs...)
	ts = ts.reopen(t) // flushes memtables into tables
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	require.Len(t, tables, 2)
	assert.Greater(t, tables[1].SizeBytes, tables[0].SizeBytes+5000*4, "at least a few bytes per noisy reading")
}

func TestDropTable(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	all := threeDays(t, ts)
	before, err := ts.Tables(ctx)
	require.NoError(t, err)

	drop, err := ts.DropTable(ctx, today-1)
	require.NoError(t, err)
	assert.Equal(t, today-1, drop.Day)
	assert.Equal(t, int64(16), drop.Readings)
	assert.Equal(t, before[1].SizeBytes, drop.SizeBytes)
	assert.Empty(t, drop.Reason)
	assert.NoDirExists(t, filepath.Join(ts.dir, "tables", (today-1).String()))

	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Day{today - 2, today}, daysOf(tables))

	p, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: (today - 1).Start(), To: (today - 1).End(), Limit: 100})
	require.NoError(t, err)
	assert.Empty(t, p.Readings, "a dropped day reads as empty")
	got, err := ts.Latest(ctx, "dev", 100)
	require.NoError(t, err)
	assert.Equal(t, append(reversed(all[20:]), reversed(all[:10])...), got, "other days intact")

	_, err = ts.DropTable(ctx, today-1)
	assert.ErrorIs(t, err, buckets.ErrNotFound)

	// A new write for the day creates a fresh table.
	ts.write(t, reading("dev", dayTick(today-1, time.Hour), "v", 99))
	tables, err = ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Day{today - 2, today - 1, today}, daysOf(tables))
	assert.Equal(t, int64(1), tables[1].Readings)

	// The drop survives a restart.
	_, err = ts.DropTable(ctx, today-2)
	require.NoError(t, err)
	ts = ts.reopen(t)
	tables, err = ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Day{today - 1, today}, daysOf(tables))
}

func daysOf(tables []buckets.TableInfo) []buckets.Day {
	out := make([]buckets.Day, len(tables))
	for i, t := range tables {
		out[i] = t.Day
	}
	return out
}

func TestDropTableWaitsForHolders(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	d := today - 1
	ts.write(t, reading("dev", dayTick(d, time.Hour), "v", 1))
	h, err := ts.acquire(ctx, d, forRead)
	require.NoError(t, err)

	dropped := make(chan error, 1)
	go func() {
		_, err := ts.DropTable(ctx, d)
		dropped <- err
	}()
	require.Eventually(t, func() bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return ts.tables[d].dropping
	}, 5*time.Second, time.Millisecond)

	// While the drop waits: reads see nothing, writes are unavailable.
	p, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: d.Start(), To: d.End(), Limit: 10})
	require.NoError(t, err)
	assert.Empty(t, p.Readings)
	err = ts.Write(ctx, []buckets.Reading{reading("dev", dayTick(d, 2*time.Hour), "v", 2)})
	assert.ErrorIs(t, err, buckets.ErrUnavailable)
	select {
	case err := <-dropped:
		t.Fatalf("drop finished while the table was held: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	// The holder can still read its table.
	_, err = scanTable(ctx, h, "dev", d.Start(), d.End(), buckets.Desc, 10, nil, nil)
	require.NoError(t, err)

	ts.release(h)
	require.NoError(t, <-dropped)
	assert.NoDirExists(t, filepath.Join(ts.dir, "tables", d.String()))
}

func TestDropTableWithConcurrentReadersAndWriters(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	for d := today - 3; d <= today; d++ {
		ts.write(t, series("dev", dayTick(d, time.Hour), time.Minute, 50)...)
	}
	victim := today - 2
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads, writes atomic.Int64
	worker := func(fn func(i int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := fn(i); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range 2 {
		worker(func(int) error {
			_, err := ts.Latest(ctx, "dev", 120)
			reads.Add(1)
			return err
		})
		worker(func(int) error {
			_, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: (today - 3).Start(), To: today.End(), Order: buckets.Asc, Limit: 500})
			reads.Add(1)
			return err
		})
	}
	worker(func(i int) error {
		// Writes to other days keep succeeding.
		err := ts.Write(ctx, []buckets.Reading{reading("dev", dayTick(today, 2*time.Hour)+buckets.Ticks(i), "w", i)})
		writes.Add(1)
		return err
	})
	worker(func(i int) error {
		// Writes to the victim day may race with the drop: either they
		// land (before, or in a fresh table after) or are unavailable.
		err := ts.Write(ctx, []buckets.Reading{reading("late", dayTick(victim, 3*time.Hour)+buckets.Ticks(i), "w", i)})
		if errors.Is(err, buckets.ErrUnavailable) {
			return nil
		}
		return err
	})
	require.Eventually(t, func() bool { return reads.Load() > 20 && writes.Load() > 20 }, 10*time.Second, time.Millisecond)
	_, err := ts.DropTable(ctx, victim)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return reads.Load() > 60 }, 10*time.Second, time.Millisecond)
	close(stop)
	wg.Wait()

	p, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: victim.Start(), To: victim.End(), Limit: 100})
	require.NoError(t, err)
	assert.Empty(t, p.Readings, "the dropped day's readings are gone")
	for _, d := range []buckets.Day{today - 3, today - 1} {
		p, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: d.Start(), To: d.End(), Limit: 100})
		require.NoError(t, err)
		assert.Len(t, p.Readings, 50, "day %s intact", d)
	}
	p, err = ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: today.Start(), To: today.End(), Limit: 100000})
	require.NoError(t, err)
	assert.Len(t, p.Readings, 50+int(writes.Load()), "every acknowledged write is there")
}

func TestDroppedDirectoryLeftoverIsRemovedOnOpen(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	leftover := filepath.Join(ts.dir, "tables", dropPrefix+"2026-01-01-1")
	require.NoError(t, os.MkdirAll(leftover, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(leftover, "000001.sst"), []byte("x"), 0o644))
	ts = ts.reopen(t)
	assert.NoDirExists(t, leftover)
	tables, err := ts.Tables(context.Background())
	require.NoError(t, err)
	assert.Empty(t, tables)
}
