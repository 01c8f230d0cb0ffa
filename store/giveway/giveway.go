// Package giveway makes the compactor give way to queries. Queries come
// before merges. Right after a burst of writes the
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

package giveway

import (
	"sync/atomic"
	"time"
)

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

// monoStart anchors Now: time.Since reads the monotonic clock.
var monoStart = time.Now()

// Now is the monotonic time since the process started. Scheduling
// only, never a decision about data, so it is not the injected clock.
func Now() time.Duration { return time.Since(monoStart) }

// Clock records when the last query began. The zero value is ready.
type Clock struct {
	last atomic.Int64 // Now of the last query's start; 0: none yet
}

// Began records a query starting now.
func (q *Clock) Began() { q.last.Store(int64(Now())) }

// Recent reports whether a query began in the queryWindow before now.
func (q *Clock) Recent(now time.Duration) bool {
	last := q.last.Load()
	return last != 0 && now-time.Duration(last) < queryWindow
}

// Last is the Now of the last query's start; 0: none yet.
func (q *Clock) Last() time.Duration { return time.Duration(q.last.Load()) }

// Run is the compactor's side of it: the start of its current run of
// merging.
type Run struct {
	q     *Clock
	since time.Duration
	pause func(time.Duration) // time.Sleep; tests replace it
}

// NewRun starts a run of merging now, giving way to the queries q
// records.
func NewRun(q *Clock) *Run {
	return &Run{q: q, since: Now(), pause: time.Sleep}
}

// Between is called between two merges: when the run of merging has
// lasted giveWayEvery and a query is coming, it pauses for
// giveWayPause and starts a new run; it reports whether it paused.
func (g *Run) Between(now time.Duration) bool {
	if now-g.since < giveWayEvery {
		return false
	}
	g.since = now
	if !g.q.Recent(now) {
		return false
	}
	g.pause(giveWayPause)
	g.since = Now()
	return true
}
