package giveway

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// newTestGiveWay is a Run whose run began at since and whose
// pauses are counted instead of slept.
func newTestGiveWay(q *Clock, since time.Duration) (*Run, *[]time.Duration) {
	var pauses []time.Duration
	return &Run{q: q, since: since, pause: func(d time.Duration) { pauses = append(pauses, d) }}, &pauses
}

func TestCompactorGivesWayOnlyWhileQueriesCome(t *testing.T) {
	base := Now() + time.Hour // later than any query recorded so far

	t.Run("no query: never pauses", func(t *testing.T) {
		g, pauses := newTestGiveWay(&Clock{}, base)
		for i := range 100 {
			assert.False(t, g.Between(base+time.Duration(i)*giveWayEvery))
		}
		assert.Empty(t, *pauses)
	})

	t.Run("a recent query: pauses once per giveWayEvery of merging", func(t *testing.T) {
		q := &Clock{}
		q.last.Store(int64(base))
		g, pauses := newTestGiveWay(q, base)
		assert.False(t, g.Between(base+giveWayEvery-1), "the run is shorter than giveWayEvery")
		assert.True(t, g.Between(base+3*time.Millisecond), "a run of 3 ms while a query came")
		g.since = base + 4*time.Millisecond
		assert.False(t, g.Between(base+5*time.Millisecond), "a new run, shorter than giveWayEvery")
		assert.True(t, g.Between(base+6*time.Millisecond), "a second run of giveWayEvery")
		assert.Equal(t, []time.Duration{giveWayPause, giveWayPause}, *pauses)
	})

	t.Run("a query older than the window: no pause", func(t *testing.T) {
		q := &Clock{}
		q.last.Store(int64(base))
		g, pauses := newTestGiveWay(q, base+queryWindow)
		assert.False(t, g.Between(base+queryWindow+giveWayEvery), "the query began queryWindow ago")
		assert.Empty(t, *pauses)
	})

}
