package store

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/countfile"
	"github.com/telemetryd/telemetryd/store/settlequeue"
)

// readFrames name the store's read calls as they show in a goroutine's
// stack.
var readFrames = []string{"store.(*Store).collect(", "store.(*Store).Get(", "store.(*Store).Aggregate("}

// onReadStack reports whether the calling goroutine is inside one of
// the store's read calls.
func onReadStack() bool {
	buf := make([]byte, 1<<16)
	st := string(buf[:runtime.Stack(buf, false)])
	for _, f := range readFrames {
		if strings.Contains(st, f) {
			return true
		}
	}
	return false
}

// readWrites records the table writes (testHookTableWrite): all of
// them, and those made on a read's goroutine.
type readWrites struct {
	mu        sync.Mutex
	all, seen []string
}

// recordReadWrites records the table writes for the rest of the test.
// Call it before opening the store, which then closes before the hook
// goes.
func recordReadWrites(t *testing.T) *readWrites {
	w := &readWrites{}
	testHookTableWrite = func(what string) {
		on := onReadStack()
		w.mu.Lock()
		defer w.mu.Unlock()
		w.all = append(w.all, what)
		if on {
			w.seen = append(w.seen, what)
		}
	}
	t.Cleanup(func() { testHookTableWrite = nil })
	return w
}

func (w *readWrites) onReads() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.seen...)
}

func (w *readWrites) kinds() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.all...)
}

// closeIdleNow runs the idle sweep, waits until the compactor tried to
// settle the tables it handed over, and sweeps again.
func (ts *testStore) closeIdleNow(t *testing.T) {
	for _, j := range ts.closeIdle() {
		<-j.Done()
	}
	ts.settlesDone(t)
	ts.closeIdle()
}

// settlesDone waits until the compactor has tried every table handed
// over so far. The store sweeps by itself too (the janitor's ticker,
// and once after a table opens), so a sweep the test makes may find a
// table already being settled and hand nothing over: the test's own
// jobs do not say that the settling ended. The compactor takes its
// queue in order, so a job for a day that has no table, queued now,
// is done only after every earlier one (a full queue is tried again).
func (ts *testStore) settlesDone(t *testing.T) {
	t.Helper()
	const noTable = buckets.Day(1) // 1970-01-02: never written by a test
	for {
		if j := ts.settles.Add(noTable); j != nil {
			waitFor(t, j.Done(), "the compactor's settling")
			return
		}
		time.Sleep(time.Millisecond) // full (a test's small bound): the compactor takes it soon
	}
}

// stallCtx is a context whose stall-th call of Err blocks until resume
// is closed, after closing entered: a read that checks its context
// between blocks stops there, holding its table.
type stallCtx struct {
	context.Context
	mu             sync.Mutex
	calls, stall   int
	entered, resum chan struct{}
}

func newStallCtx(stall int) *stallCtx {
	return &stallCtx{Context: context.Background(), stall: stall, entered: make(chan struct{}), resum: make(chan struct{})}
}

func (c *stallCtx) Err() error {
	c.mu.Lock()
	c.calls++
	n := c.calls
	c.mu.Unlock()
	if n == c.stall {
		close(c.entered)
		<-c.resum
	}
	return c.Context.Err()
}

// waitFor fails the test when ch is not closed in a long while: a guard
// against hanging, not a measure.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("gave up waiting: %s", what)
	}
}

// A read of a table whose idle close is merging its open blocks shares
// the open table: it neither waits for the merge, its rollups and its
// count file, nor does any of that itself. The table closes once the
// compactor settled it, merged.
func TestReadDuringIdleCloseDoesNotWaitForItsCompaction(t *testing.T) {
	writes := recordReadWrites(t)
	compacting, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	testHookCompactCommit = func() {
		once.Do(func() { close(compacting) })
		<-gate
	}
	t.Cleanup(func() { testHookCompactCommit = nil })
	opened := false
	defer func() {
		if !opened {
			close(gate)
		}
	}()
	ts := newTestStore(t, withRollups, func(o *Options) { o.CompactInterval = time.Hour; o.IdleClose = time.Minute })
	ctx := context.Background()
	d := today - 5
	for i := range 3 { // three commits: three open blocks
		ts.write(t, series("dev", dayTick(d, time.Hour+time.Duration(i)*time.Minute), time.Second, 10)...)
	}
	require.Len(t, blocksOf(t, ts, d, "dev"), 3)
	require.NotContains(t, writes.kinds(), "rollup")

	ts.clock.Advance(2 * time.Minute) // idle
	swept := make(chan []*settlequeue.Job, 1)
	go func() { swept <- ts.closeIdle() }()
	waitFor(t, compacting, "the idle close's compaction")

	type answer struct {
		rs  []buckets.Reading
		err error
	}
	got := make(chan answer, 1)
	go func() {
		rs, err := ts.Latest(ctx, "dev", 5)
		got <- answer{rs, err}
	}()
	var a answer
	for done := false; !done; {
		select {
		case a = <-got:
			done = true
		default:
			if ts.reopening(d) {
				opened = true
				close(gate) // let it finish
				a = <-got
				t.Fatalf("the read waited for the table's idle close, merging under way, to end (%d readings)", len(a.rs))
			}
			runtime.Gosched()
		}
	}
	require.NoError(t, a.err)
	want := ticksOf(series("dev", dayTick(d, time.Hour+2*time.Minute+5*time.Second), time.Second, 5))
	slices.Reverse(want)
	assert.Equal(t, want, ticksOf(a.rs), "the newest readings, newest first")
	assert.True(t, ts.isOpen(d), "the table stays open while the compactor settles it")

	opened = true
	close(gate)
	for _, j := range <-swept { // the compactor's settling ends
		waitFor(t, j.Done(), "the settling")
	}
	// A sweep of the store's own may have handed the table over first.
	ts.settlesDone(t)
	ts.clock.Advance(2 * time.Minute) // idle again after the read
	ts.closeIdleNow(t)
	assert.False(t, ts.isOpen(d), "settled, the idle table is closed")
	assert.Empty(t, writes.onReads(), "no table write on a read's goroutine")
	assert.Subset(t, writes.kinds(), []string{"rollup", "count"}, "the settling wrote the rollups and the count file")

	assert.Len(t, blocksOf(t, ts, d, "dev"), 1, "the open blocks were merged before the close")
	n, ok, err := countfile.Read(ts.tableDir(d))
	require.NoError(t, err)
	assert.True(t, ok, "the count file was saved")
	assert.Equal(t, int64(30), n)
	p, err := ts.Aggregate(ctx, buckets.AggregateQuery{Device: "dev", From: d.Start(), To: d.End(), Interval: buckets.Ticks(time.Hour / 100), Limit: 10})
	require.NoError(t, err)
	require.Len(t, p.Buckets, 1)
}

// A read that gives up the last reference to a table being dropped
// closes nothing and writes nothing: the close (a flush of the
// writable database) runs on a goroutine of its own, and the drop
// completes once it did.
func TestLastReleaseByAReadAfterADropWritesNothing(t *testing.T) {
	writes := recordReadWrites(t)
	ts := newTestStore(t, func(o *Options) { o.CompactInterval = time.Hour })
	d := today - 5
	ts.write(t, series("dev", dayTick(d, time.Hour), time.Second, 20)...)
	require.NotContains(t, writes.kinds(), "close")

	sc := newStallCtx(2) // Ping, then the first block read
	got := make(chan int, 1)
	go func() {
		p, err := ts.Range(sc, buckets.RangeQuery{Device: "dev", From: d.Start(), To: d.End(), Limit: 100})
		assert.NoError(t, err)
		got <- len(p.Readings)
	}()
	waitFor(t, sc.entered, "the read")
	dropped := make(chan error, 1)
	go func() {
		_, err := ts.DropTable(context.Background(), d)
		dropped <- err
	}()
	require.Eventually(t, func() bool { return ts.dropping(d) }, 5*time.Second, time.Millisecond)
	close(sc.resum)
	assert.Equal(t, 20, <-got, "the read that held the table read it whole")
	require.NoError(t, <-dropped)
	assert.NoDirExists(t, ts.tableDir(d))
	assert.Empty(t, writes.onReads(), "no table write on a read's goroutine")
	assert.Contains(t, writes.kinds(), "close", "the writable table was closed")
}

// A full queue leaves an idle table open (the sweep hands it over
// again later) and never closes it unsettled. The compactor is kept
// busy settling a third day first, so that it takes nothing from the
// queue while the sweep fills it.
func TestIdleTableWaitsForRoomInTheSettleQueue(t *testing.T) {
	old := maxSettleJobs
	maxSettleJobs = 1
	gate, entered := make(chan struct{}), make(chan struct{})
	open := sync.OnceFunc(func() { close(gate) })
	busy := sync.OnceFunc(func() { close(entered) })
	defer open()
	testHookCompactCommit = func() { busy(); <-gate }
	t.Cleanup(func() { maxSettleJobs, testHookCompactCommit = old, nil })
	ts := newTestStore(t, func(o *Options) { o.CompactInterval = time.Hour; o.IdleClose = time.Minute })
	a, b, c := today-6, today-5, today-7
	for i := range 2 {
		for _, d := range []buckets.Day{a, b, c} {
			ts.write(t, reading("dev", dayTick(d, time.Duration(i)*time.Second), "v", i))
		}
	}
	require.NotNil(t, ts.settles.Add(c))
	<-entered // the compactor settles c, held at its commit; the queue is empty
	ts.clock.Advance(2 * time.Minute)
	jobs := ts.closeIdle()
	require.Len(t, jobs, 1, "one of the two idle tables fits the queue")
	open()
	<-jobs[0].Done()
	ts.closeIdleNow(t) // the settled one closes; the other is handed over now
	assert.False(t, ts.isOpen(a) && ts.isOpen(b), "one closed")
	ts.closeIdleNow(t)
	assert.False(t, ts.isOpen(a))
	assert.False(t, ts.isOpen(b))
	for _, d := range []buckets.Day{a, b} {
		assert.Len(t, blocksOf(t, ts, d, "dev"), 1, "%s merged before it closed", d)
	}
}
