package buckets

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSummaryMergeEqualsAddingEveryValue(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		n := 1 + rng.IntN(50)
		var whole, left, right Summary
		cut := rng.IntN(n + 1)
		for i := 0; i < n; i++ {
			k := Ticks(rng.IntN(1000))
			v := float64(rng.IntN(200) - 100)
			whole.Add(k, v)
			if i < cut {
				left.Add(k, v)
			} else {
				right.Add(k, v)
			}
		}
		left.Merge(right)
		assert.Equal(t, whole.Count, left.Count)
		assert.Equal(t, whole.Sum, left.Sum)
		assert.Equal(t, whole.Min, left.Min)
		assert.Equal(t, whole.Max, left.Max)
		assert.Equal(t, whole.FirstTicks, left.FirstTicks)
		assert.Equal(t, whole.LastTicks, left.LastTicks)
	}
}

func TestSummaryFirstAndLastFollowTime(t *testing.T) {
	var s Summary
	s.Add(50, 5)
	s.Add(10, 1)
	s.Add(90, 9)
	s.Add(30, 3)
	assert.Equal(t, Summary{Count: 4, Sum: 18, Min: 1, Max: 9, First: 1, Last: 9, FirstTicks: 10, LastTicks: 90}, s)
	assert.Equal(t, 4.5, s.Avg())
}

func TestNumeric(t *testing.T) {
	for _, tc := range []struct {
		v    Value
		want float64
		ok   bool
	}{
		{Float(2.5), 2.5, true}, {Int(-3), -3, true}, {Bool(true), 1, true}, {Bool(false), 0, true}, {String("x"), 0, false},
	} {
		got, ok := Numeric(tc.v)
		assert.Equal(t, tc.ok, ok, tc.v.Kind.String())
		assert.Equal(t, tc.want, got, tc.v.Kind.String())
	}
}

func TestAggregateQueryLeavesPerMillisecondOutOfJSONWhenFalse(t *testing.T) {
	b, err := json.Marshal(AggregateQuery{Device: "d", Interval: TicksPerSecond, Limit: 1})
	assert.NoError(t, err)
	assert.NotContains(t, string(b), "PerMillisecond", "a node that does not know the field refuses it")
	b, err = json.Marshal(AggregateQuery{Device: "d", Interval: TicksPerSecond, Limit: 1, PerMillisecond: true})
	assert.NoError(t, err)
	var back AggregateQuery
	assert.NoError(t, json.Unmarshal(b, &back))
	assert.True(t, back.PerMillisecond)
}
