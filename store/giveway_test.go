package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// newTestGiveWay is a giveWay whose run began at since and whose
// pauses are counted instead of slept.
func newTestGiveWay(q *queryClock, since time.Duration) (*giveWay, *[]time.Duration) {
	var pauses []time.Duration
	return &giveWay{q: q, since: since, pause: func(d time.Duration) { pauses = append(pauses, d) }}, &pauses
}

func TestCompactorGivesWayOnlyWhileQueriesCome(t *testing.T) {
	base := monoNow() + time.Hour // later than any query recorded so far

	t.Run("no query: never pauses", func(t *testing.T) {
		g, pauses := newTestGiveWay(&queryClock{}, base)
		for i := range 100 {
			assert.False(t, g.between(base+time.Duration(i)*giveWayEvery))
		}
		assert.Empty(t, *pauses)
	})

	t.Run("a recent query: pauses once per giveWayEvery of merging", func(t *testing.T) {
		q := &queryClock{}
		q.last.Store(int64(base))
		g, pauses := newTestGiveWay(q, base)
		assert.False(t, g.between(base+giveWayEvery-1), "the run is shorter than giveWayEvery")
		assert.True(t, g.between(base+3*time.Millisecond), "a run of 3 ms while a query came")
		g.since = base + 4*time.Millisecond
		assert.False(t, g.between(base+5*time.Millisecond), "a new run, shorter than giveWayEvery")
		assert.True(t, g.between(base+6*time.Millisecond), "a second run of giveWayEvery")
		assert.Equal(t, []time.Duration{giveWayPause, giveWayPause}, *pauses)
	})

	t.Run("a query older than the window: no pause", func(t *testing.T) {
		q := &queryClock{}
		q.last.Store(int64(base))
		g, pauses := newTestGiveWay(q, base+queryWindow)
		assert.False(t, g.between(base+queryWindow+giveWayEvery), "the query began queryWindow ago")
		assert.Empty(t, *pauses)
	})

	t.Run("queries recorded by the store's reads", func(t *testing.T) {
		ts := newTestStore(t)
		d := today
		ts.write(t, series("dev", dayTick(d, time.Hour), time.Second, 3)...)
		assert.Zero(t, ts.queries.last.Load(), "writes are not queries")
		_, err := ts.Latest(t.Context(), "dev", 1)
		assert.NoError(t, err)
		assert.True(t, ts.queries.recent(monoNow()), "a latest query was recorded")
	})
}
