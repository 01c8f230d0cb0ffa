package store

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// samplesOf is Samples gathered per name.
func samplesOf(t *testing.T, ts *testStore, dev buckets.DeviceID, from, to buckets.Ticks, names ...string) map[string][]sampleColumn {
	t.Helper()
	got := map[string][]sampleColumn{}
	err := ts.Samples(context.Background(), dev, from, to, names, func(name string, ticks []buckets.Ticks, vals []float64) {
		got[name] = append(got[name], sampleColumn{ticks: ticks, vals: vals})
	})
	require.NoError(t, err)
	return got
}

// rangeSamples is what Samples must give, read through Range: the
// numeric values of names in the readings of [from, to).
func rangeSamples(t *testing.T, ts *testStore, dev buckets.DeviceID, from, to buckets.Ticks, names ...string) map[string][]sampleColumn {
	t.Helper()
	page, err := ts.Range(context.Background(), buckets.RangeQuery{Device: dev, From: from, To: to, Order: buckets.Asc, Limit: 1_000_000})
	require.NoError(t, err)
	require.False(t, page.More)
	cols := map[string]*sampleColumn{}
	for _, r := range page.Readings {
		for _, n := range names {
			v, ok := r.Get(n)
			if !ok {
				continue
			}
			if x, ok := buckets.Numeric(v); ok {
				if cols[n] == nil {
					cols[n] = &sampleColumn{}
				}
				cols[n].ticks, cols[n].vals = append(cols[n].ticks, r.Ticks), append(cols[n].vals, x)
			}
		}
	}
	want := map[string][]sampleColumn{}
	for n, c := range cols {
		want[n] = []sampleColumn{*c}
	}
	return want
}

func TestSamplesEqualRangeAcrossOverlappingLateAndDuplicateBlocks(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	rng := rand.New(rand.NewPCG(7, 11))
	step := buckets.Ticks(10 * buckets.TicksPerSecond)
	k0 := at(-5 * time.Hour)
	names := []string{"a", "b", "c", "s"}
	value := func(i int) any {
		switch rng.IntN(5) {
		case 0:
			return i
		case 1:
			return rng.IntN(2) == 0
		case 2:
			return "text" // never a sample
		}
		return float64(i) / 3
	}
	write := func(lo, hi int) {
		var rs []buckets.Reading
		for i := lo; i < hi; i++ {
			var kv []any
			for _, n := range names {
				if rng.IntN(3) > 0 {
					kv = append(kv, n, value(i))
				}
			}
			if len(kv) == 0 {
				kv = []any{"a", i}
			}
			rs = append(rs, reading("dev", k0+buckets.Ticks(i)*step, kv...))
		}
		ts.write(t, rs...)
	}
	check := func(what string) {
		for range 20 {
			from := k0 + buckets.Ticks(rng.IntN(1200)-100)*step + buckets.Ticks(rng.IntN(3))
			to := from + buckets.Ticks(rng.IntN(1500))*step
			asked := names[:1+rng.IntN(len(names))]
			require.Equal(t, rangeSamples(t, ts, "dev", from, to, asked...), samplesOf(t, ts, "dev", from, to, asked...), what)
		}
		assert.Equal(t, rangeSamples(t, ts, "dev", 0, buckets.MaxTicks, names...), samplesOf(t, ts, "dev", 0, buckets.MaxTicks, names...), what)
	}
	// In order, then late batches inside written windows, then
	// batches that overwrite readings (duplicates of other values),
	// with compactions between some of them.
	for b := range 5 {
		write(b*200, (b+1)*200)
	}
	check("in order")
	ts.compact(false)
	write(150, 260)
	write(10, 20)
	check("late and overlapping, open blocks")
	ts.compact(true)
	check("compacted")
	write(500, 505)
	write(0, 1000)
	write(990, 1010)
	require.Greater(t, len(blocksOf(t, ts, today, "dev")), 3)
	check("duplicates over sealed blocks")
	ts = ts.reopen(t)
	check("after a restart")
}

func TestSamplesLeavesOutNamesWithoutNumbers(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	k := at(-time.Hour)
	ts.write(t, reading("dev", k, "a", 1.5, "s", "x"), reading("dev", k+1, "a", 2, "b", true))
	got := samplesOf(t, ts, "dev", 0, buckets.MaxTicks, "a", "s", "b", "none")
	assert.Equal(t, map[string][]sampleColumn{
		"a": {{ticks: []buckets.Ticks{k, k + 1}, vals: []float64{1.5, 2}}},
		"b": {{ticks: []buckets.Ticks{k + 1}, vals: []float64{1}}},
	}, got)
	assert.Empty(t, samplesOf(t, ts, "other", 0, buckets.MaxTicks, "a"), "an unknown device")
	assert.Empty(t, samplesOf(t, ts, "dev", k+2, buckets.MaxTicks, "a"), "an empty span")
}
