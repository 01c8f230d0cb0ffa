package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// TestColumnCacheAnswersAsTheBlocksDo asks the same aggregates again
// and again while the blocks under them change (a late reading, a
// merge, a compaction, a reopen): every answer equals one computed from
// the readings, and a question asked again over unchanged blocks is
// answered from the column cache without a miss.
func TestColumnCacheAnswersAsTheBlocksDo(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	require.NotNil(t, ts.cols, "the column cache is on by default")
	k0 := dayTick(today-1, 0)
	step := buckets.Ticks(10 * time.Second / 100)
	for _, dev := range []string{"a", "b", "c"} {
		var rs []buckets.Reading
		for i := range 2 * 360 * 6 { // 12 hours every 10 s
			k := k0 + buckets.Ticks(i)*step
			rs = append(rs, reading(dev, k, "load", float64(i%91)/7, "status", i%3, "driver", "x"))
		}
		for i := 0; i < len(rs); i += 400 {
			ts.write(t, rs[i:min(i+400, len(rs))]...)
		}
	}
	ts.compact(true)
	tenMin := buckets.Ticks(10 * time.Minute / 100)
	queries := func(dev string) []buckets.AggregateQuery {
		return []buckets.AggregateQuery{
			{Device: buckets.DeviceID(dev), From: k0 + 7, To: k0 + 12*3600*buckets.TicksPerSecond, Interval: tenMin, Limit: 1000, Fields: []string{"load"}},
			{Device: buckets.DeviceID(dev), From: k0, To: k0 + 5*3600*buckets.TicksPerSecond + 3, Interval: tenMin, Limit: 1000, Fields: []string{"status", "load", "absent"}},
			{Device: buckets.DeviceID(dev), From: k0, To: buckets.MaxTicks, Interval: tenMin, Limit: 1000, Fields: []string{"absent"}},
			// Hour buckets hold whole hour blocks: header summaries.
			{Device: buckets.DeviceID(dev), From: k0, To: buckets.MaxTicks, Interval: 6 * tenMin, Limit: 1000, Fields: []string{"load", "absent"}},
			{Device: buckets.DeviceID(dev), From: k0 + 3*6*tenMin + 1, To: buckets.MaxTicks, Interval: 2 * 6 * tenMin, Limit: 1000, Fields: []string{"status"}, PerMillisecond: true},
			// 7-minute buckets straddle the hour blocks: one bucket
			// takes values of two blocks (a kept fold, then values).
			{Device: buckets.DeviceID(dev), From: k0, To: k0 + 12*3600*buckets.TicksPerSecond, Interval: 7 * tenMin / 10, Limit: 1000, Fields: []string{"load", "status"}, PerMillisecond: true},
		}
	}
	answers := map[string][]buckets.AggregateBucket{}
	check := func(what string) {
		t.Helper()
		for _, dev := range []string{"a", "b", "c"} {
			for i, q := range queries(dev) {
				want := naiveAggregate(t, ts, q)
				got := aggregateAll(t, ts, q)
				if len(want) == 0 {
					require.Empty(t, got, what)
					continue
				}
				assertSameBuckets(t, want, got) // a header's sum adds in another order
				answers[fmt.Sprint(what, dev, i)] = got
			}
		}
		ts.cols.Wait()
	}
	check("first read")
	hits, misses := ts.cols.Stats()
	require.Positive(t, misses)
	check("asked again")     // folds of the cached columns are made
	check("asked once more") // and merged
	for k, v := range answers {
		for _, again := range []string{"asked again", "asked once more"} {
			if first, ok := answers[strings.Replace(k, again, "first read", 1)]; ok && strings.HasPrefix(k, again) {
				require.Equal(t, first, v, "the cached answer is the uncached one to the bit: %s", k)
			}
		}
	}
	hits2, misses2 := ts.cols.Stats()
	require.Equal(t, misses, misses2, "nothing changed: every column comes from the cache")
	require.Greater(t, hits2, hits)

	// A late reading inside a sealed hour, then the compaction that
	// merges it into that hour's block.
	late := k0 + 3*3600*buckets.TicksPerSecond + 5*step + 1
	ts.write(t, reading("b", late, "load", 1000.0))
	check("late reading")
	ts.compact(true)
	check("late reading merged")
	// A new value of a stored reading: the merge rewrites its block.
	ts.write(t, reading("c", k0+4*3600*buckets.TicksPerSecond+2*step, "load", -5.0, "status", 9))
	check("merged value")
	ts.compact(true)
	check("merged value compacted")
	_, misses3 := ts.cols.Stats()
	require.Greater(t, misses3, misses2, "rewritten blocks are read again")

	ts = ts.reopen(t)
	check("reopened")
	_, m := ts.cols.Stats()
	require.Positive(t, m, "a reopened table's blocks are read again")
	// Columns enter the cache after the read that missed them (check
	// waits for that at its end), so the hits come from the next ask.
	check("reopened, asked again")
	h, _ := ts.cols.Stats()
	require.Positive(t, h)
}

// TestColumnCacheOff answers as the cache does with the cache off.
func TestColumnCacheOff(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t, func(o *Options) { o.ColumnCacheSize = -1 })
	require.Nil(t, ts.cols)
	k0 := dayTick(today-1, 0)
	ts.write(t, series("a", k0, 10*time.Second, 1000)...)
	ts.compact(true)
	q := buckets.AggregateQuery{Device: "a", From: k0 + 3, To: buckets.MaxTicks, Interval: buckets.Ticks(7 * time.Minute / 100), Limit: 1000, Fields: []string{"n"}}
	want := naiveAggregate(t, ts, q)
	require.Equal(t, want, aggregateAll(t, ts, q))
	require.Equal(t, want, aggregateAll(t, ts, q))
	h, m := ts.cols.Stats()
	require.Zero(t, h+m)
	_, err := ts.Aggregate(context.Background(), q)
	require.NoError(t, err)
}

// TestColumnCacheAfterADayIsDroppedAndWrittenAgain: a day table made
// again after a drop numbers its commits from the start, so its blocks
// may have the keys and versions of the dropped table's; the cache must
// not answer with the dropped table's columns.
func TestColumnCacheAfterADayIsDroppedAndWrittenAgain(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	k0 := dayTick(today-1, 0)
	write := func(scale float64) {
		rs := series("a", k0, 10*time.Second, 720)
		for i := range rs {
			rs[i].Values[0].Value = buckets.Float(scale * float64(i))
		}
		ts.write(t, rs...)
		ts.compact(true)
	}
	q := buckets.AggregateQuery{Device: "a", From: k0 + 3, To: buckets.MaxTicks, Interval: buckets.Ticks(10 * time.Minute / 100), Limit: 1000, Fields: []string{"n"}}
	write(1)
	first := aggregateAll(t, ts, q)
	ts.cols.Wait()
	require.Equal(t, first, aggregateAll(t, ts, q))
	_, err := ts.DropTable(context.Background(), today-1)
	require.NoError(t, err)
	write(2)
	want := naiveAggregate(t, ts, q)
	require.NotEqual(t, first, want)
	require.Equal(t, want, aggregateAll(t, ts, q))
}
