package store

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/aggregate"
)

// unixEpoch is 1970-01-01T00:00:00Z in ticks: buckets are aligned to
// multiples of their width since then.
var unixEpoch = buckets.MustTicks(time.Unix(0, 0))

// aggCounts says how an aggregator read the blocks it added.
type aggCounts struct{ headers, columns, decoded int }

// aggCountsOf is a's aggCounts.
func aggCountsOf(a *aggregate.Aggregator) aggCounts {
	h, c, d := a.Counts()
	return aggCounts{h, c, d}
}

// naiveAggregate computes the answer of q from a full range read.
func naiveAggregate(t *testing.T, ts *testStore, q buckets.AggregateQuery) []buckets.AggregateBucket {
	t.Helper()
	page, err := ts.Range(context.Background(), buckets.RangeQuery{Device: q.Device, From: q.From, To: q.To, Order: buckets.Asc, Limit: 1 << 20})
	require.NoError(t, err)
	sums := map[buckets.Ticks]map[string]*buckets.Summary{}
	if q.PerMillisecond { // newest first: the first value of a name in a millisecond is its newest
		slices.Reverse(page.Readings)
	}
	lastMs := map[string]buckets.Ticks{}
	for _, r := range page.Readings {
		off := (r.Ticks - unixEpoch) % q.Interval
		if off < 0 {
			off += q.Interval
		}
		start := r.Ticks - off
		for _, f := range r.Values {
			if len(q.Fields) > 0 && !slices.Contains(q.Fields, f.Name) {
				continue
			}
			x, ok := buckets.Numeric(f.Value)
			if !ok {
				continue
			}
			if q.PerMillisecond {
				if ms, seen := lastMs[f.Name]; seen && ms == r.Ticks/10000 {
					continue
				}
				lastMs[f.Name] = r.Ticks / 10000
			}
			if sums[start] == nil {
				sums[start] = map[string]*buckets.Summary{}
			}
			if sums[start][f.Name] == nil {
				sums[start][f.Name] = &buckets.Summary{}
			}
			sums[start][f.Name].Add(r.Ticks, x)
		}
	}
	var out []buckets.AggregateBucket
	for start, m := range sums {
		b := buckets.AggregateBucket{Start: start}
		for name, s := range m {
			b.Values = append(b.Values, buckets.NamedSummary{Name: name, Summary: *s})
		}
		slices.SortFunc(b.Values, func(x, y buckets.NamedSummary) int { return compareStrings(x.Name, y.Name) })
		out = append(out, b)
	}
	slices.SortFunc(out, func(x, y buckets.AggregateBucket) int { return int(x.Start - y.Start) })
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// assertSameBuckets compares buckets, sums within rounding (a header
// sum adds in a different order).
func assertSameBuckets(t *testing.T, want, got []buckets.AggregateBucket) {
	t.Helper()
	require.Equal(t, len(want), len(got), "bucket count")
	for i := range want {
		require.Equal(t, want[i].Start, got[i].Start, "bucket %d start", i)
		require.Equal(t, len(want[i].Values), len(got[i].Values), "bucket %d names", i)
		for j, w := range want[i].Values {
			g := got[i].Values[j]
			require.Equal(t, w.Name, g.Name)
			ws, gs := w.Summary, g.Summary
			assert.InDelta(t, ws.Sum, gs.Sum, 1e-6*math.Max(1, math.Abs(ws.Sum)), "bucket %d %s sum", i, w.Name)
			ws.Sum, gs.Sum = 0, 0
			assert.Equal(t, ws, gs, "bucket %d %s", i, w.Name)
		}
	}
}

// aggregateAll pages through q with its limit.
func aggregateAll(t *testing.T, ts *testStore, q buckets.AggregateQuery) []buckets.AggregateBucket {
	t.Helper()
	var out []buckets.AggregateBucket
	for {
		p, err := ts.Aggregate(context.Background(), q)
		require.NoError(t, err)
		require.LessOrEqual(t, len(p.Buckets), q.Limit)
		out = append(out, p.Buckets...)
		if !p.More {
			return out
		}
		require.NotEmpty(t, p.Buckets)
		after := p.Buckets[len(p.Buckets)-1].Start
		q.After = &after
	}
}

func TestAggregateMatchesReadingsAcrossBlockKinds(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	step := 10 * time.Second
	k0 := dayTick(today-1, 0)
	var rs []buckets.Reading
	for i := range 2 * 8640 {
		k := k0 + buckets.Ticks(i)*buckets.Ticks(step/100)
		rs = append(rs, reading("dev", k, "temp", 20+float64(i%97)/10, "n", i, "ok", i%3 == 0, "s", "x"))
	}
	for i := 0; i < len(rs); i += 500 {
		ts.write(t, rs[i:min(i+500, len(rs))]...)
	}
	// Same-key merges and late readings: overlapping blocks.
	ts.write(t, reading("dev", rs[100].Ticks, "temp", 99.5), reading("dev", rs[9000].Ticks, "extra", 7))
	queries := []buckets.AggregateQuery{
		{Device: "dev", From: 0, To: buckets.MaxTicks, Interval: buckets.Ticks(time.Hour / 100), Limit: 1000},
		{Device: "dev", From: k0 + 12345, To: k0 + buckets.TicksPerDay + 777, Interval: buckets.Ticks(time.Hour / 100), Limit: 7},
		{Device: "dev", From: 0, To: buckets.MaxTicks, Interval: buckets.Ticks(7 * time.Minute / 100), Limit: 100, Fields: []string{"temp"}},
		{Device: "dev", From: 0, To: buckets.MaxTicks, Interval: buckets.TicksPerDay, Limit: 1},
		// 5-minute buckets cut every one-hour block, and from and to cut blocks and buckets.
		{Device: "dev", From: k0 + buckets.Ticks(31*time.Minute/100) + 7, To: k0 + buckets.Ticks(37*time.Hour/100) + 3, Interval: buckets.Ticks(5 * time.Minute / 100), Limit: 10000, Fields: []string{"n", "ok", "s", "temp"}},
	}
	check := func(what string) {
		for _, q := range queries {
			assertSameBuckets(t, naiveAggregate(t, ts, q), aggregateAll(t, ts, q))
		}
	}
	check("open blocks")
	ts.compact(true)
	check("sealed blocks")
	ts.write(t, reading("dev", rs[5000].Ticks, "temp", -1.0), reading("dev", rs[5000].Ticks+1, "temp", -2.0))
	check("sealed and late blocks")

	// Hourly buckets over sealed hourly blocks come from headers.
	h, err := ts.acquire(context.Background(), today-1, forRead)
	require.NoError(t, err)
	defer ts.release(h)
	agg := aggregate.New(queries[0], 0)
	_, err = aggregateTable(context.Background(), agg, h, (today - 1).Start(), (today - 1).End())
	require.NoError(t, err)
	assert.Greater(t, aggCountsOf(agg).headers, 20, "whole blocks are read from their headers")
	assert.Less(t, aggCountsOf(agg).decoded, 4, "only overlapping blocks are decoded")

	// 5-minute buckets over the same sealed blocks read their columns.
	agg = aggregate.New(queries[4], 0)
	_, err = aggregateTable(context.Background(), agg, h, (today - 1).Start(), (today - 1).End())
	require.NoError(t, err)
	assert.Zero(t, aggCountsOf(agg).headers)
	assert.Greater(t, aggCountsOf(agg).columns, 20, "blocks that overlap no other are read column by column")
	assert.Less(t, aggCountsOf(agg).decoded, 4, "only overlapping blocks are decoded as readings")

	// One value per millisecond: these blocks have no two readings in
	// one millisecond, and say so, so their headers still serve.
	q := queries[0]
	q.PerMillisecond = true
	assertSameBuckets(t, naiveAggregate(t, ts, q), aggregateAll(t, ts, q))
	agg = aggregate.New(q, 0)
	_, err = aggregateTable(context.Background(), agg, h, (today - 1).Start(), (today - 1).End())
	require.NoError(t, err)
	assert.Greater(t, aggCountsOf(agg).headers, 20, "blocks of distinct milliseconds are read from their headers")
}

func TestAggregatePerMillisecondKeepsTheNewestValueOfEachMillisecond(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	k0 := dayTick(today-1, 0)
	ms := buckets.Ticks(10000)
	var rs []buckets.Reading
	for i := range 8640 {
		k := k0 + buckets.Ticks(i)*buckets.Ticks(10*time.Second/100)
		rs = append(rs, reading("dev", k, "temp", float64(i%50), "n", i))
		switch i % 7 {
		case 0: // two more in the same millisecond, the newest without temp
			rs = append(rs, reading("dev", k+3, "temp", -1.0), reading("dev", k+ms-1, "n", -i))
		case 3: // the first tick of the next millisecond: its own sample
			rs = append(rs, reading("dev", k+ms, "temp", 100.0))
		}
	}
	for i := 0; i < len(rs); i += 333 {
		ts.write(t, rs[i:min(i+333, len(rs))]...)
	}
	check := func(what string) {
		for _, q := range []buckets.AggregateQuery{
			{Device: "dev", From: 0, To: buckets.MaxTicks, Interval: buckets.Ticks(time.Hour / 100), Limit: 1000, PerMillisecond: true},
			{Device: "dev", From: k0 + buckets.Ticks(time.Hour/100), To: k0 + buckets.Ticks(5*time.Hour/100), Interval: buckets.Ticks(5 * time.Minute / 100), Limit: 1000, Fields: []string{"temp"}, PerMillisecond: true},
			{Device: "dev", From: 0, To: buckets.MaxTicks, Interval: buckets.Ticks(time.Minute / 100), Limit: 10000, PerMillisecond: true},
		} {
			want := naiveAggregate(t, ts, q)
			assertSameBuckets(t, want, aggregateAll(t, ts, q))
			q.PerMillisecond = false
			require.NotEqual(t, want[0].Values[0].Summary.Count, naiveAggregate(t, ts, q)[0].Values[0].Summary.Count, "%s: the data has readings sharing a millisecond", what)
		}
	}
	check("open blocks")
	ts.compact(true)
	check("sealed blocks")
	// Late readings in the same milliseconds as sealed ones, in blocks of their own.
	ts.write(t, reading("dev", rs[100].Ticks+5, "temp", 77.0), reading("dev", rs[2000].Ticks+ms-1, "temp", -77.0))
	check("sealed and late blocks")

	// Every sealed block here has readings sharing a millisecond: its
	// header counts each of them, so it is never used per millisecond.
	h, err := ts.acquire(context.Background(), today-1, forRead)
	require.NoError(t, err)
	defer ts.release(h)
	agg := aggregate.New(buckets.AggregateQuery{Device: "dev", Interval: buckets.Ticks(time.Hour / 100), Limit: 1000, PerMillisecond: true}, 0)
	_, err = aggregateTable(context.Background(), agg, h, (today - 1).Start(), (today - 1).End())
	require.NoError(t, err)
	assert.Zero(t, aggCountsOf(agg).headers)
	assert.Greater(t, aggCountsOf(agg).columns, 15)
}

func TestAggregateRejectsBadQueries(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	_, err := ts.Aggregate(ctx, buckets.AggregateQuery{Device: "d", To: 10, Interval: buckets.TicksPerSecond - 1, Limit: 1})
	assert.ErrorIs(t, err, buckets.ErrInvalidArgument)
	_, err = ts.Aggregate(ctx, buckets.AggregateQuery{Device: "d", To: 10, Interval: buckets.TicksPerSecond, Limit: 0})
	assert.ErrorIs(t, err, buckets.ErrInvalidArgument)
	p, err := ts.Aggregate(ctx, buckets.AggregateQuery{Device: "unknown", To: buckets.MaxTicks, Interval: buckets.TicksPerSecond, Limit: 1})
	require.NoError(t, err)
	assert.Empty(t, p.Buckets)
	assert.False(t, p.More)
}
