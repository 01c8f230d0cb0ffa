package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// Every reading of a run must be inside the service's accepted window
// when it is published, or the service refuses it and the check counts
// it lost. A run of 6,300,000 readings at 5,000/s once stamped the last
// 1.4 million more than five minutes ahead of the clock.
func TestReadingsBaseKeepsReadingsInsideTheWindow(t *testing.T) {
	now := time.Date(2026, 11, 25, 19, 16, 0, 0, time.UTC)
	for _, n := range []int{1, 500_000, 3_600_000, 6_300_000, 20_000_000} {
		base := readingsBase(now, n)
		newest := buckets.MustTicks(base.Add(time.Duration(n-1) * time.Millisecond))
		oldest := buckets.MustTicks(base)
		require.NoError(t, buckets.DefaultWindow.Check(newest, now), "%d readings: the newest at the start", n)
		require.NoError(t, buckets.DefaultWindow.Check(oldest, now.Add(24*time.Hour)), "%d readings: the oldest a day later", n)
		assert.False(t, base.After(now.Add(-time.Hour)), "%d readings: at least an hour back", n)
		assert.Equal(t, base, base.Truncate(time.Second))
	}
}

// A cut past its uptime waits for a publish in flight, counted from its
// send until its answer arrives (not until the run loop handles it):
// 7 of 10 cuts of a NATS run once came after every reading was acked.
func TestCutWaitsForAPublishInFlight(t *testing.T) {
	ctx := t.Context()
	p := &publisher{}
	results := make(chan pubResult, 1)
	done := make(chan error, 1)
	p.inFlight.Add(1) // as run does before it publishes
	go p.waitAck(ctx, done, 0, results)
	assert.Equal(t, int64(1), p.awaitInFlight(ctx, time.Second), "a publish is out and unanswered")
	done <- nil
	<-results
	assert.Zero(t, p.inFlight.Load(), "answered: no longer in flight, before the run loop handled it")
	assert.Zero(t, p.awaitInFlight(ctx, 10*time.Millisecond), "nothing in flight: the wait gives up")

	go func() {
		time.Sleep(20 * time.Millisecond)
		p.inFlight.Add(1)
	}()
	assert.Equal(t, int64(1), p.awaitInFlight(ctx, time.Minute), "the cut waits until a publish goes out")
}
