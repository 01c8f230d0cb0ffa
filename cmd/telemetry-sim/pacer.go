package main

import (
	"context"
	"time"
)

// Pacing. The pacer is a token bucket refilled at the target rate. It
// sleeps at least minSleep at a time, so at high rates it sends small
// bursts (about rate×minSleep readings) instead of spinning, and the
// bucket holds at most burstWindow worth of tokens, so a stall (slow
// acks, a paused process) is not followed by a flood.
const (
	minSleep    = time.Millisecond
	burstWindow = 50 * time.Millisecond
)

// pacer limits readings per second. A nil *pacer does not limit.
type pacer struct {
	rate   float64 // tokens per second
	burst  float64 // bucket size
	tokens float64
	last   time.Time
}

// newPacer returns a pacer for rate readings per second that can hand
// out at least maxTake readings at once, starting with a full message
// worth of tokens at now. rate 0 returns nil: no limit.
func newPacer(rate float64, maxTake int, now time.Time) *pacer {
	if rate <= 0 {
		return nil
	}
	burst := max(float64(maxTake), rate*burstWindow.Seconds())
	return &pacer{rate: rate, burst: burst, tokens: float64(maxTake), last: now}
}

// reserve takes n tokens if the bucket holds them at now and returns 0;
// otherwise it takes nothing and returns how long to wait before the
// bucket will hold n.
func (p *pacer) reserve(now time.Time, n int) time.Duration {
	if el := now.Sub(p.last); el > 0 {
		p.tokens = min(p.burst, p.tokens+el.Seconds()*p.rate)
	}
	p.last = now
	need := float64(n)
	if p.tokens >= need {
		p.tokens -= need
		return 0
	}
	return time.Duration((need - p.tokens) / p.rate * float64(time.Second))
}

// wait blocks until n tokens are available and takes them, or until
// ctx is done. now is the pacing clock.
func (p *pacer) wait(ctx context.Context, n int, now func() time.Time) error {
	if p == nil {
		return ctx.Err()
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		d := p.reserve(now(), n)
		if d == 0 {
			return nil
		}
		d = max(d, minSleep)
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
	}
}
