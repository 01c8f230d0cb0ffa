package main

import (
	"sync"
	"time"
)

// pacer says when each new message of a run is due. It starts at
// Config.Rate; after each cut the kill loop plans again (cutInterval)
// so that publishing lasts past the last cut: at a fixed rate a run
// whose restarts took longer than its rate allowed for ran out of
// readings before its last cuts (a line protocol run, whose restarts
// grew from 15 s to 40 s, published its last reading before 3 of its
// 20 cuts).
type pacer struct {
	mu       sync.Mutex
	from     time.Time     // when the plan's first message is due
	first    int           // the plan's first message
	interval time.Duration // between two messages of the plan
}

// newPacer plans messages of batch readings at rate readings per
// second from started on; rate 0 (as fast as acks allow) returns nil.
func newPacer(started time.Time, rate, batch int) *pacer {
	if rate <= 0 {
		return nil
	}
	return &pacer{from: started, interval: rateInterval(rate, batch)}
}

// rateInterval is the time between two messages of batch readings at
// rate readings per second.
func rateInterval(rate, batch int) time.Duration {
	return time.Duration(float64(batch) / float64(rate) * float64(time.Second))
}

// due is when message m may be sent (m at or after the plan's first).
func (p *pacer) due(m int) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.from.Add(time.Duration(max(m-p.first, 0)) * p.interval)
}

// replan spaces the messages from next on by interval, from now.
func (p *pacer) replan(now time.Time, next int, interval time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.from, p.first, p.interval = now, next, interval
}

// maxSpeedup bounds how much faster than Config.Rate a plan may go
// when the cuts come quicker than the rate allowed for.
const maxSpeedup = 4

// cutInterval plans the rest of a run after a cut and the restart that
// followed it: done of kills cuts have been made, elapsed since
// publishing started, the last of them lastCycle after the one before
// (uptime, cut and restart; from the start for the first); left
// messages are still to be sent. It spreads them over the cuts to come
// plus one more cycle, each cycle as long as the longer of the mean so
// far and the last one (restarts tend to grow with the data), so that
// a cycle would have to take twice the estimate for publishing to end
// before the last cut. The interval is never below base/maxSpeedup,
// base being the one of Config.Rate.
func cutInterval(left, done, kills int, elapsed, lastCycle, base time.Duration) time.Duration {
	if left <= 0 || done <= 0 {
		return base
	}
	cycle := max(elapsed/time.Duration(done), lastCycle)
	span := time.Duration(max(kills-done, 0)+1) * cycle
	return max(span/time.Duration(left), base/maxSpeedup)
}
