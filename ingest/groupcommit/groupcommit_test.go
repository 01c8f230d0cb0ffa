package groupcommit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// recorder is a Writer that records every Write call's devices, can
// hold the calls until released, and fails the calls holding a device
// named in fail.
type recorder struct {
	mu      sync.Mutex
	calls   [][]buckets.DeviceID
	stored  map[buckets.DeviceID]int // readings committed per device
	entered chan struct{}            // a Write call began (when not nil)
	hold    chan struct{}            // Write calls wait for it (when not nil)
	fail    buckets.DeviceID
	assigns int
}

func newRecorder() *recorder { return &recorder{stored: map[buckets.DeviceID]int{}} }

func (r *recorder) Write(_ context.Context, rs []buckets.Reading) error {
	if r.entered != nil {
		r.entered <- struct{}{}
	}
	if r.hold != nil {
		<-r.hold
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var devs []buckets.DeviceID
	for _, x := range rs {
		devs = append(devs, x.Device)
	}
	r.calls = append(r.calls, devs)
	if r.fail != "" && slices.Contains(devs, r.fail) {
		return fmt.Errorf("write: %w: device %s", buckets.ErrInvalidReading, r.fail)
	}
	for _, d := range devs {
		r.stored[d]++
	}
	return nil
}

func (r *recorder) Assign(context.Context, []buckets.Assignment) error {
	r.mu.Lock()
	r.assigns++
	r.mu.Unlock()
	return nil
}

func (r *recorder) committed(d buckets.DeviceID) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stored[d]
}

func readingsOf(dev buckets.DeviceID, n int) []buckets.Reading {
	rs := make([]buckets.Reading, n)
	for i := range rs {
		rs[i] = buckets.Reading{Device: dev, Ticks: buckets.Ticks(i + 1)}
	}
	return rs
}

// TestWritesQueuedDuringACommitShareTheNext: while one commit runs,
// the writes of three other callers wait, and the next commit holds
// all three; each caller returns after its own readings are stored.
func TestWritesQueuedDuringACommitShareTheNext(t *testing.T) {
	rec := newRecorder()
	rec.entered, rec.hold = make(chan struct{}, 8), make(chan struct{})
	g := New(rec)
	ctx := context.Background()

	first := make(chan error, 1)
	go func() { first <- g.Write(ctx, readingsOf("a", 2)) }()
	<-rec.entered // the first commit runs and holds

	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, dev := range []buckets.DeviceID{"b", "c", "d"} {
		wg.Go(func() {
			errs[i] = g.Write(ctx, readingsOf(dev, 3))
			// Returned: its readings are committed.
			assert.Equal(t, 3, rec.committed(dev), "device %s", dev)
		})
	}
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.queue) == 3
	}, 10*time.Second, time.Millisecond, "the three writes queue behind the running commit")
	close(rec.hold)
	require.NoError(t, <-first)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}

	require.Len(t, rec.calls, 2, "one commit for the first write, one for the three queued")
	second := rec.calls[1]
	assert.Len(t, second, 9)
	for _, dev := range []buckets.DeviceID{"b", "c", "d"} {
		assert.Equal(t, 3, countOf(second, dev), "device %s in the shared commit", dev)
	}
}

func countOf(devs []buckets.DeviceID, d buckets.DeviceID) int {
	n := 0
	for _, x := range devs {
		if x == d {
			n++
		}
	}
	return n
}

// TestAFailedSharedCommitFailsOnlyTheCallerItBelongsTo: a shared
// commit that fails is written again caller by caller; the others'
// readings are stored and only the poison caller gets the error.
func TestAFailedSharedCommitFailsOnlyTheCallerItBelongsTo(t *testing.T) {
	rec := newRecorder()
	rec.fail = "poison"
	rec.entered, rec.hold = make(chan struct{}, 16), make(chan struct{})
	g := New(rec)
	ctx := context.Background()

	first := make(chan error, 1)
	go func() { first <- g.Write(ctx, readingsOf("a", 1)) }()
	<-rec.entered

	var wg sync.WaitGroup
	results := map[buckets.DeviceID]error{}
	var mu sync.Mutex
	for _, dev := range []buckets.DeviceID{"b", "poison", "c"} {
		wg.Go(func() {
			err := g.Write(ctx, readingsOf(dev, 2))
			mu.Lock()
			results[dev] = err
			mu.Unlock()
		})
	}
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.queue) == 3
	}, 10*time.Second, time.Millisecond)
	close(rec.hold)
	require.NoError(t, <-first)
	wg.Wait()

	assert.NoError(t, results["b"])
	assert.NoError(t, results["c"])
	require.Error(t, results["poison"])
	assert.ErrorIs(t, results["poison"], buckets.ErrInvalidReading, "the caller's own error, unchanged")
	assert.Equal(t, 2, rec.committed("b"))
	assert.Equal(t, 2, rec.committed("c"))
	assert.Equal(t, 0, rec.committed("poison"))
	// The first commit, the shared one that failed, then each alone.
	assert.Len(t, rec.calls, 5)
}

// TestManyWritersEachReturnAfterItsCommit: under many concurrent
// writers (run with -race), every write returns only once its readings
// are stored, none is lost, and the lead always passes on (no caller
// waits forever).
func TestManyWritersEachReturnAfterItsCommit(t *testing.T) {
	rec := newRecorder()
	g := New(rec)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a caller's cancelled context does not end a shared commit
	const writers, rounds = 8, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			dev := buckets.DeviceID(fmt.Sprintf("d%d", w))
			for i := range rounds {
				require.NoError(t, g.Write(ctx, readingsOf(dev, 1+i%3)))
				want := 0
				for j := 0; j <= i; j++ {
					want += 1 + j%3
				}
				require.Equal(t, want, rec.committed(dev), "writer %d round %d", w, i)
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, len(rec.calls), writers*rounds)
	g.mu.Lock()
	assert.False(t, g.busy, "no lead left behind")
	assert.Empty(t, g.queue)
	g.mu.Unlock()
}

func TestEmptyWriteAndAssignPassThrough(t *testing.T) {
	rec := newRecorder()
	g := New(rec)
	require.NoError(t, g.Write(context.Background(), nil))
	assert.Empty(t, rec.calls, "an empty write commits nothing")
	require.NoError(t, g.Assign(context.Background(), []buckets.Assignment{{}}))
	assert.Equal(t, 1, rec.assigns)
}
