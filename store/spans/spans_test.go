package spans

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/telemetryd/telemetryd/buckets"
)

func TestSpans(t *testing.T) {
	var s Set
	assert.False(t, s.Overlaps(0, buckets.MaxTicks), "empty")
	s.Add(10, 20)
	s.Add(40, 50)
	assert.True(t, s.Overlaps(20, 30))
	assert.False(t, s.Overlaps(21, 39), "the gap")
	assert.True(t, s.Overlaps(0, 100))
	s.Add(21, 39) // fills the gap: one range
	assert.Equal(t, 1, s.n)
	assert.Equal(t, span{10, 50}, s.r[0])
	s.Add(100, 110)
	s.Add(0, 1)
	s.Add(60, 61)
	s.Add(200, 300)
	assert.Equal(t, maxSpans, s.n)
	assert.Equal(t, []span{{0, 50}, {60, 61}, {100, 110}, {200, 300}}, s.r[:s.n], "2-9 was the smallest gap")
}

// Whatever is added stays covered, and nothing more than the ranges
// and the gaps merged away is.
func TestSpansCoverWhatWasAdded(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var s Set
		var added []span
		for range 20 {
			lo := buckets.Ticks(rng.IntN(1000))
			hi := lo + buckets.Ticks(rng.IntN(20))
			s.Add(lo, hi)
			added = append(added, span{lo, hi})
			assert.LessOrEqual(t, s.n, maxSpans)
			for i := 1; i < s.n; i++ {
				assert.Less(t, s.r[i-1].hi+1, s.r[i].lo, "sorted, apart: %v", s.r[:s.n])
			}
			for _, a := range added {
				for k := a.lo; k <= a.hi; k++ {
					assert.True(t, s.Overlaps(k, k), "%d of %v lost: %v", k, a, s.r[:s.n])
				}
			}
		}
	}
}
