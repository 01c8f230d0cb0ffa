package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// simulate drives p on a synthetic clock for span, taking n tokens at a
// time and sleeping as reserve asks (at least minSleep, like wait), and
// returns how many tokens were taken and how many sleeps it needed.
func simulate(p *pacer, start time.Time, span time.Duration, n int) (taken int, sleeps int) {
	now := start
	for now.Sub(start) < span {
		d := p.reserve(now, n)
		if d == 0 {
			taken += n
			if float64(taken) > 2*p.rate*span.Seconds()+float64(n) {
				return taken, sleeps // far past the rate: stop rather than spin forever
			}
			continue
		}
		now = now.Add(max(d, minSleep))
		sleeps++
	}
	return taken, sleeps
}

func TestPacerHoldsRate(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	tests := []struct {
		rate float64
		n    int
	}{
		{1, 1}, {10, 1}, {10, 10}, {1000, 1}, {1000, 100}, {100_000, 1}, {100_000, 10}, {1_000_000, 1000},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%g/s by %d", tt.rate, tt.n), func(t *testing.T) {
			span := 20 * time.Second
			taken, sleeps := simulate(newPacer(tt.rate, tt.n, start), start, span, tt.n)
			want := tt.rate * span.Seconds()
			assert.InDelta(t, want, float64(taken), want*0.01+float64(tt.n), "readings in %s", span)
			// No busy waiting: never more wake-ups than one per minSleep,
			// nor more than one per message.
			assert.LessOrEqual(t, sleeps, int(span/minSleep)+1)
			assert.LessOrEqual(t, sleeps, int(want)/tt.n+1)
		})
	}
}

func TestPacerBurstAfterStallIsBounded(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	p := newPacer(1000, 1, start)
	require.Equal(t, time.Duration(0), p.reserve(start, 1))
	// A ten-second stall earns at most burstWindow worth of readings.
	later := start.Add(10 * time.Second)
	burst := 0
	for burst < 1_000_000 && p.reserve(later, 1) == 0 {
		burst++
	}
	assert.Equal(t, int(1000*burstWindow.Seconds()), burst)
}

func TestPacerFirstMessageImmediate(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	p := newPacer(1, 10, start)
	assert.Equal(t, time.Duration(0), p.reserve(start, 10), "a full batch may go at once even below one reading a second")
	assert.Equal(t, 10*time.Second, p.reserve(start, 10))
}

func TestPacerUnlimited(t *testing.T) {
	p := newPacer(0, 1, time.Now())
	assert.Nil(t, p)
	assert.NoError(t, p.wait(context.Background(), 1_000_000, time.Now))
}

func TestPacerWaitRealClock(t *testing.T) {
	p := newPacer(500, 1, time.Now())
	start := time.Now()
	for range 100 {
		require.NoError(t, p.wait(context.Background(), 1, time.Now))
	}
	el := time.Since(start)
	assert.GreaterOrEqual(t, el, 190*time.Millisecond, "100 readings at 500/s took %s", el)
	assert.Less(t, el, 2*time.Second)
}

func TestPacerWaitStopsOnCancel(t *testing.T) {
	p := newPacer(0.001, 1, time.Now())
	require.NoError(t, p.wait(context.Background(), 1, time.Now))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	assert.ErrorIs(t, p.wait(ctx, 1, time.Now), context.DeadlineExceeded)
	assert.Less(t, time.Since(start), time.Second)
}
