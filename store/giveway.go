package store

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// Queries come before merges. Right after a burst of writes the
// compactor has a backlog of merges, and with Badger's own compactions
// it can hold every processor for seconds. Go hands a request that
// arrives meanwhile to a processor only when one runs out of work or,
// failing that, about every 10 ms, so on two cores a query of 0.3 ms
// waited 10-50 ms to be scheduled. While queries come (one began in the
// last queryWindow), the compactor therefore pauses for giveWayPause
// between two merges once it merged for giveWayEvery: its processor,
// out of work, picks up waiting requests. Steady queries slow the
// merges down (by a third, more when a loaded machine makes the pauses
// overrun) but never stop them, and without queries the compactor
// never pauses. Pausing as long as it merged, up to 8 ms, measured
// worse than not pausing at all (BENCHMARKS.md history).

const (
	// queryWindow is how long after a query began the compactor
	// counts queries as coming.
	queryWindow = 50 * time.Millisecond
	// giveWayEvery is the least merging the compactor does between
	// pauses while queries come.
	giveWayEvery = 2 * time.Millisecond
	// giveWayPause is each pause.
	giveWayPause = time.Millisecond
)

// monoStart anchors monoNow: time.Since reads the monotonic clock.
var monoStart = time.Now()

// monoNow is the monotonic time since the process started. Scheduling
// only, never a decision about data, so it is not the injected clock.
func monoNow() time.Duration { return time.Since(monoStart) }

// queryClock records when the last query began.
type queryClock struct {
	last atomic.Int64 // monoNow of the last query's start; 0: none yet
}

// began records a query starting now.
func (q *queryClock) began() { q.last.Store(int64(monoNow())) }

// recent reports whether a query began in the queryWindow before now.
func (q *queryClock) recent(now time.Duration) bool {
	last := q.last.Load()
	return last != 0 && now-time.Duration(last) < queryWindow
}

// giveWay is the compactor's side of it: the start of its current run
// of merging.
type giveWay struct {
	q     *queryClock
	since time.Duration
	pause func(time.Duration) // time.Sleep; tests replace it
}

// newGiveWay starts a run of merging now.
func (s *Store) newGiveWay() *giveWay {
	return &giveWay{q: &s.queries, since: monoNow(), pause: time.Sleep}
}

// between is called between two merges: when the run of merging has
// lasted giveWayEvery and a query is coming, it pauses for
// giveWayPause and starts a new run; it reports whether it paused.
func (g *giveWay) between(now time.Duration) bool {
	if now-g.since < giveWayEvery {
		return false
	}
	g.since = now
	if !g.q.recent(now) {
		return false
	}
	g.pause(giveWayPause)
	g.since = monoNow()
	return true
}

// acquireQuery is acquire for a query: it records that a query came.
func (s *Store) acquireQuery(ctx context.Context, day buckets.Day) (*table, error) {
	s.queries.began()
	return s.acquire(ctx, day, forRead)
}
