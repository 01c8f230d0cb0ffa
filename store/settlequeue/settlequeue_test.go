package settlequeue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// today is a day for the tests.
const today = buckets.Day(20000)

func TestSettleQueueIsBoundedAndCoalesces(t *testing.T) {
	q := New(2)
	a := q.Add(today - 3)
	require.NotNil(t, a)
	assert.Same(t, a, q.Add(today-3), "a day queued again joins its job")
	b := q.Add(today - 4)
	require.NotNil(t, b)
	assert.Nil(t, q.Add(today-5), "past the bound a new day is refused")
	assert.Same(t, b, q.Add(today-4), "a queued day is still joined when the queue is full")
	assert.Equal(t, 2, q.Len())
	jobs := q.Take()
	assert.Equal(t, []*Job{a, b}, jobs, "oldest first")
	assert.NotNil(t, q.Add(today-5), "taken, there is room again")
}
