package store

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// dbOf is the open database of t, nil when it is closed.
func (ts *testStore) dbOf(t *table) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return t.db != nil
}

// dropping reports whether the table of day is being dropped.
func (ts *testStore) dropping(day buckets.Day) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.tables[day]
	return t != nil && t.dropping
}

func TestLastReleaseOfDoomedTableDropsIt(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	d := today - 5
	ts.write(t, series("dev", dayTick(d, time.Hour), time.Second, 20)...)
	h1, err := ts.acquire(ctx, d, forRead)
	require.NoError(t, err)
	h2, err := ts.acquire(ctx, d, forRead)
	require.NoError(t, err)
	require.Same(t, h1, h2, "both readers hold the one open table")

	dropped := make(chan error, 1)
	go func() {
		_, err := ts.DropTable(ctx, d)
		dropped <- err
	}()
	require.Eventually(t, func() bool { return ts.dropping(d) }, 5*time.Second, time.Millisecond)

	ts.release(h1)
	select {
	case err := <-dropped:
		t.Fatalf("the drop finished while a reader held the table: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	assert.True(t, ts.dbOf(h2), "a release that is not the last closes nothing")
	out, err := scanTable(ctx, h2, "dev", d.Start(), d.End(), buckets.Desc, 100, nil, nil)
	require.NoError(t, err)
	assert.Len(t, out, 20, "the remaining reader reads the whole day")
	assert.DirExists(t, ts.tableDir(d))

	ts.release(h2)
	require.NoError(t, <-dropped)
	assert.False(t, ts.dbOf(h2), "the drop ended once the last release's close did")
	assert.NoDirExists(t, ts.tableDir(d))
	_, err = ts.Get(ctx, "dev", dayTick(d, time.Hour))
	assert.ErrorIs(t, err, buckets.ErrNotFound, "a dropped day reads as empty")
}

func TestDropCalledOffByContextKeepsTable(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	d := today - 5
	ts.write(t, series("dev", dayTick(d, time.Hour), time.Second, 20)...)
	h, err := ts.acquire(ctx, d, forRead)
	require.NoError(t, err)

	dctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	_, err = ts.DropTable(dctx, d)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.False(t, ts.dropping(d))
	assert.True(t, ts.isOpen(d), "the reader's handle is the table's again")

	// New readers share the open table at once, while h is still held.
	got := make(chan int, 1)
	go func() {
		p, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: d.Start(), To: d.End(), Limit: 100})
		assert.NoError(t, err)
		got <- len(p.Readings)
	}()
	select {
	case n := <-got:
		assert.Equal(t, 20, n)
	case <-time.After(5 * time.Second):
		t.Fatal("a read after a called-off drop waited for the earlier reader")
	}
	ts.release(h)
	assert.True(t, ts.isOpen(d), "releasing after a called-off drop does not close the table")
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(20), countsOf(tables)[d])

	// A later drop goes through.
	_, err = ts.DropTable(ctx, d)
	require.NoError(t, err)
	assert.NoDirExists(t, ts.tableDir(d))
}

func TestReaderKeepsTableOpenThroughLRUClose(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t, func(o *Options) { o.MaxOpenTables = 1; o.IdleClose = time.Minute })
	ctx := context.Background()
	held, a, b := today-6, today-5, today-4
	for _, d := range []buckets.Day{held, a, b} {
		ts.write(t, series("dev", dayTick(d, time.Hour), time.Second, 10)...)
	}
	ts = ts.reopen(t)
	h, err := ts.acquire(ctx, held, forRead)
	require.NoError(t, err)

	for _, d := range []buckets.Day{a, b} {
		_, err := ts.Get(ctx, "dev", dayTick(d, time.Hour))
		require.NoError(t, err)
	}
	ts.clock.Advance(2 * time.Minute) // every table is idle and one past the bound
	sweeps := 0
	require.Eventually(t, func() bool {
		ts.closeIdle() // the opener of b may still hold it for a moment
		sweeps++
		return !ts.isOpen(a) && !ts.isOpen(b)
	}, 5*time.Second, time.Millisecond, "the idle tables are closed")
	for range 3 {
		ts.closeIdle()
	}
	assert.True(t, ts.isOpen(held), "a held table stays open however often a close is asked for (%d sweeps)", sweeps+3)
	assert.True(t, ts.dbOf(h))
	out, err := scanTable(ctx, h, "dev", held.Start(), held.End(), buckets.Desc, 100, nil, nil)
	require.NoError(t, err)
	assert.Len(t, out, 10, "the holder reads its table after the sweeps")

	ts.release(h)
	_, err = ts.Get(ctx, "dev", dayTick(a, time.Hour))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !ts.isOpen(held) }, 5*time.Second, time.Millisecond,
		"released, the table is closed by the next sweep over the bound")
	assert.True(t, ts.isOpen(a))
}

// TestHandleChurn runs reads, writes, drops, idle closes and writable
// reopens of the same few cold days at once (run it with -race). A
// table opened twice at once, or closed under a reader, shows as an
// error from a call or an error in the log; afterwards no reference
// may be left behind and every day must still work.
func TestHandleChurn(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	ts := newTestStore(t, func(o *Options) {
		o.MaxOpenTables = 2
		o.IdleClose = time.Millisecond
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	ctx := context.Background()
	days := []buckets.Day{today - 9, today - 8, today - 7, today - 6}
	for _, d := range days {
		ts.write(t, series("dev", dayTick(d, time.Hour), time.Second, 5)...)
	}
	ts = ts.reopen(t)
	pick := func() buckets.Day { return days[rand.IntN(len(days))] }

	var calls, drops atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	run := func(n int, fn func(i int) error) {
		for range n {
			wg.Go(func() {
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
					calls.Add(1)
				}
			})
		}
	}
	run(4, func(int) error { // readers through the API
		d := pick()
		_, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: d.Start(), To: d.End(), Limit: 50})
		return err
	})
	run(4, func(int) error { // holders of the table itself
		h, err := ts.acquire(ctx, pick(), forRead)
		if err != nil || h == nil {
			return err
		}
		defer ts.release(h)
		_, err = scanTable(ctx, h, "dev", h.day.Start(), h.day.End(), buckets.Asc, 50, nil, nil)
		return err
	})
	run(2, func(i int) error { // writers: fresh tables after drops, writable reopens
		d := pick()
		err := ts.Write(ctx, []buckets.Reading{reading("dev", dayTick(d, 2*time.Hour)+buckets.Ticks(i), "w", i)})
		if errors.Is(err, buckets.ErrUnavailable) {
			return nil // raced with a drop
		}
		return err
	})
	run(1, func(int) error { // dropper
		_, err := ts.DropTable(ctx, pick())
		if errors.Is(err, buckets.ErrNotFound) || errors.Is(err, buckets.ErrUnavailable) {
			return nil
		}
		if err == nil {
			drops.Add(1)
		}
		time.Sleep(5 * time.Millisecond)
		return err
	})
	run(1, func(int) error { // sweeper
		ts.closeIdle()
		ts.clock.Advance(time.Millisecond)
		return nil
	})
	require.Eventually(t, func() bool { return calls.Load() > 600 && drops.Load() >= 3 }, 60*time.Second, time.Millisecond)
	close(stop)
	wg.Wait()

	require.Eventually(t, func() bool { return ts.settled() }, 5*time.Second, time.Millisecond,
		"every reference was given up: only the tables' own remain")
	for _, d := range days {
		ts.write(t, reading("after", dayTick(d, 3*time.Hour), "v", 1))
	}
	got, err := ts.Latest(ctx, "after", 10)
	require.NoError(t, err)
	assert.Len(t, got, len(days), "every day works after the churn")
	require.NoError(t, ts.Close())
	for _, line := range strings.Split(logs.String(), "\n") {
		assert.NotContains(t, line, "level=ERROR", "no table failed to open or close")
	}
	entries, err := os.ReadDir(ts.tablesDir)
	require.NoError(t, err)
	for _, e := range entries {
		assert.False(t, strings.HasPrefix(e.Name(), dropPrefix), "drops removed their directories")
	}
}

// settled reports whether no reference to any table is held but the
// tables' own, and no handle is opening or closing.
func (ts *testStore) settled() bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, t := range ts.tables {
		if t.dropping || (t.last != nil && t.last != t.cur) {
			return false
		}
		if h := t.cur; h != nil && (h.refs != 1 || t.live != h) {
			return false
		}
	}
	return true
}
