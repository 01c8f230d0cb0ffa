package resultcache

import (
	"fmt"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// answer is a matrix of n series with a point at every step of
// [start, end], valued by series and time.
func answer(n int, start, end, step int64) promql.Matrix {
	var m promql.Matrix
	for i := range n {
		s := promql.Series{Metric: labels.FromStrings("device", fmt.Sprintf("d%d", i))}
		for t := start; t <= end; t += step {
			s.Floats = append(s.Floats, promql.FPoint{T: t, F: float64(i*1000) + float64(t)})
		}
		m = append(m, s)
	}
	return m
}

func TestGetAnswersKeptStepsAndTheRestFromNext(t *testing.T) {
	c := New(1 << 20)
	k := KeyOf("q", 1000, 10)
	_, next, f := c.Get(k, 1000, 1100, 0)
	assert.Equal(t, int64(1000), next, "nothing kept")
	c.Put(f, answer(2, 1000, 1100, 10), 1000, 1100, 0)

	kept, next, f := c.Get(k, 1020, 1120, 0)
	c.Drop(f)
	assert.Equal(t, int64(1110), next)
	require.Len(t, kept, 2)
	assert.Equal(t, int64(1020), kept[0].Floats[0].T)
	assert.Len(t, kept[0].Floats, 9)

	kept, next, f = c.Get(k, 1000, 1050, 0)
	c.Drop(f)
	assert.Equal(t, int64(1060), next, "kept whole")
	assert.Len(t, kept[1].Floats, 6)

	_, next, f = c.Get(k, 990, 1050, 0)
	c.Drop(f)
	assert.Equal(t, int64(990), next, "a window that begins before the kept one")
	_, next, f = c.Get(k, 1000, 1050, 1)
	c.Drop(f)
	assert.Equal(t, int64(1000), next, "another attribute generation")
	assert.Equal(t, Stats{Hits: 1, Partial: 1, Misses: 3, Kept: 1}, c.Stats())
}

// TestCommitDuringEvaluation commits a reading while an answer is being
// evaluated: only the steps before it are kept.
func TestCommitDuringEvaluation(t *testing.T) {
	c := New(1 << 20)
	k := KeyOf("q", 0, 10)
	_, _, f := c.Get(k, 0, 100, 0)
	c.Committed(55)
	c.Put(f, answer(1, 0, 100, 10), 0, 100, 0)
	kept, next, f := c.Get(k, 0, 100, 0)
	c.Drop(f)
	assert.Equal(t, int64(60), next)
	assert.Len(t, kept[0].Floats, 6)

	c.Committed(30)
	_, next, f = c.Get(k, 0, 100, 0)
	c.Drop(f)
	assert.Equal(t, int64(30), next, "kept steps at and after a commit are let go of")
	c.Committed(0)
	_, next, f = c.Get(k, 0, 100, 0)
	assert.Equal(t, int64(0), next)
	c.Removed()
	c.Put(f, answer(1, 0, 100, 10), 0, 100, 0)
	_, next, f = c.Get(k, 0, 100, 0)
	c.Drop(f)
	assert.Equal(t, int64(0), next, "an evaluation begun before a removal is not kept")
	assert.False(t, c.Active())
}

// TestBound keeps answers of many queries in a small cache: the bytes
// held stay within it, the least recently used go first.
func TestBound(t *testing.T) {
	one := sizeOf(answer(3, 0, 990, 10))
	c := New(3*one + one/2)
	for i := range 10 {
		_, _, f := c.Get(KeyOf(fmt.Sprint(i), 0, 10), 0, 990, 0)
		c.Put(f, answer(3, 0, 990, 10), 0, 990, 0)
		if i == 7 {
			_, _, f = c.Get(KeyOf("7", 0, 10), 0, 990, 0) // 7 used again: 8 and 9 push out 5 and 6, not 7
			c.Drop(f)
		}
		assert.LessOrEqual(t, c.Stats().Bytes, 3*one+one/2)
	}
	s := c.Stats()
	assert.Equal(t, int64(7), s.Evicted)
	for q, kept := range map[string]bool{"7": true, "8": true, "9": true, "6": false, "0": false} {
		_, next, f := c.Get(KeyOf(q, 0, 10), 0, 990, 0)
		c.Drop(f)
		assert.Equal(t, kept, next > 990, q)
	}
	_, _, f := c.Get(KeyOf("big", 0, 10), 0, 990, 0)
	c.Put(f, answer(20, 0, 990, 10), 0, 990, 0)
	assert.Equal(t, s.Kept, c.Stats().Kept, "an answer larger than the cache is not kept")
}

func TestMergeCopiesAndSorts(t *testing.T) {
	kept := answer(2, 0, 20, 10)
	fresh := answer(3, 30, 40, 10)
	m := Merge(kept, fresh[1:])
	require.Len(t, m, 3)
	assert.Equal(t, "d0", m[0].Metric.Get("device"))
	assert.Len(t, m[0].Floats, 3)
	assert.Len(t, m[1].Floats, 5)
	assert.Len(t, m[2].Floats, 2)
	fresh[1].Floats[0].F = -1
	assert.NotEqual(t, -1.0, m[1].Floats[3].F, "points are copied")
}

func TestLastBefore(t *testing.T) {
	assert.Equal(t, int64(100), lastBefore(0, 100, 10, 101))
	assert.Equal(t, int64(90), lastBefore(0, 100, 10, 100))
	assert.Equal(t, int64(50), lastBefore(0, 100, 10, 55))
	assert.Equal(t, int64(0), lastBefore(0, 100, 10, 1))
	assert.Equal(t, int64(-10), lastBefore(0, 100, 10, 0))
	assert.Equal(t, int64(3), lastBefore(3, 103, 10, 4))
}
