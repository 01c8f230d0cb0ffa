package promapi

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// readCountingStore is countedStore counting projected reads too.
type readCountingStore struct {
	countedStore
	samples atomic.Int64
}

func (s *readCountingStore) Samples(ctx context.Context, dev buckets.DeviceID, from, to buckets.Ticks, names []string, fn func(string, []buckets.Ticks, []float64)) error {
	s.samples.Add(1)
	return s.Store.Samples(ctx, dev, from, to, names, fn)
}

// TestProjectedReadsMatchRawReadings runs queries whose samples come
// from the store's projected reads and the same queries over pages of
// raw readings, over data with late, rewritten and same-millisecond
// readings and values that are not numbers: the answers are identical,
// and a device's series selected by one query are read in one call.
func TestProjectedReadsMatchRawReadings(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	windowData(t, dir, now)
	o := store.DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Now = func() time.Time { return now }
	st, err := store.Open(context.Background(), dir, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	src := &readCountingStore{countedStore: countedStore{Store: st}}
	fast, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw.q.noPushdown = true

	run := func(a *API, q string, from, to time.Time, step time.Duration) promql.Matrix {
		qry, err := a.engine.NewRangeQuery(context.Background(), a.q, nil, q, from, to, step)
		require.NoError(t, err)
		defer qry.Close()
		res := qry.Exec(context.Background())
		require.NoError(t, res.Err, q)
		m, err := res.Matrix()
		require.NoError(t, err)
		out := make(promql.Matrix, len(m))
		for i, s := range m {
			out[i] = promql.Series{Metric: s.Metric, Floats: slices.Clone(s.Floats)}
		}
		return out
	}
	for _, c := range []struct {
		q     string
		span  time.Duration
		step  time.Duration
		reads int64 // projected reads of the fast query: one per device (-1: not checked)
	}{
		{`last_over_time(temp[6h])`, 0, time.Minute, 3},
		{`last_over_time({__name__=~"temp|hum"}[6h])`, 0, time.Minute, 3},
		{`last_over_time(temp[6h]) <= 0.9 * last_over_time(hum[6h])`, 0, time.Minute, 3},
		{`temp`, 3 * time.Hour, 17 * time.Second, 3},
		{`hum{device="w-1"}`, 29 * time.Hour, time.Minute, 1},
		{`rate(temp[5m])`, 2 * time.Hour, 30 * time.Second, 3},
		{`count_over_time(temp[90s])`, time.Hour, time.Second * 45, 3},
		{`count_over_time((avg_over_time(hum[10m]) > 40)[4h:10m])`, 0, time.Minute, -1}, // per-window summaries when aligned
		{`avg by (device) (avg_over_time(temp[6h]) / avg_over_time(hum[6h]))`, 0, time.Minute, 3},
	} {
		for _, at := range []time.Time{now, now.Add(-7*time.Hour - 1234*time.Millisecond), now.Add(-24 * time.Hour)} {
			from, to := at.Add(-c.span), at
			before := src.samples.Load()
			rangesBefore := src.ranges.Load()
			got := run(fast, c.q, from, to, c.step)
			require.Equal(t, rangesBefore, src.ranges.Load(), "%s: no raw pages", c.q)
			if c.span == 0 && c.reads >= 0 {
				require.Equal(t, c.reads, src.samples.Load()-before, "%s: reads", c.q)
			}
			want := run(raw, c.q, from, to, c.step)
			require.NotEmpty(t, want, c.q)
			require.Equal(t, want, got, "%s at %s", c.q, at)
		}
	}
	// Steps with gaps between their windows read page by page from each
	// step, as before.
	samplesBefore, rangesBefore := src.samples.Load(), src.ranges.Load()
	got := run(fast, `temp`, now.Add(-29*time.Hour), now, 2*time.Hour)
	require.Equal(t, samplesBefore, src.samples.Load(), "sparse steps: no projected reads")
	require.Greater(t, src.ranges.Load(), rangesBefore, "sparse steps: pages")
	require.Equal(t, run(raw, `temp`, now.Add(-29*time.Hour), now, 2*time.Hour), got)
}

// TestPagesSplittingAMillisecondKeepItsNewestValue reads a series page
// by page with pages that end inside a millisecond: its sample is the
// newest reading of it, as when the millisecond lies in one page.
func TestPagesSplittingAMillisecondKeepItsNewestValue(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	src := newMemSource()
	k := buckets.MustTicks(now.Add(-time.Minute))
	var rs []buckets.Reading
	for i := range 12 { // four milliseconds of three readings, the newest holding 10*ms+2
		ms := buckets.Ticks(i/3) * buckets.Ticks(time.Millisecond/100)
		rs = append(rs, buckets.Reading{Ticks: k + ms + buckets.Ticks(i%3),
			Values: []buckets.Field{{Name: "temp", Value: buckets.Float(float64(10*(i/3) + i%3))}}})
	}
	src.add("d", nil, rs...)
	for size := 1; size <= 13; size++ {
		a, err := New(Config{Source: src, Now: func() time.Time { return now }})
		require.NoError(t, err)
		a.q.pageSize = size
		qry, err := a.engine.NewInstantQuery(context.Background(), a.q, nil, `temp[5m]`, now)
		require.NoError(t, err)
		res := qry.Exec(context.Background())
		require.NoError(t, res.Err)
		m, err := res.Matrix()
		require.NoError(t, err)
		require.Len(t, m, 1)
		var got []float64
		for _, p := range m[0].Floats {
			got = append(got, p.F)
		}
		require.Equal(t, []float64{2, 12, 22, 32}, got, "pages of %d readings", size)
		qry.Close()
	}
}

// TestInstantLastOverTimeFromSummaries answers instant last_over_time
// queries from the store's summaries, and the answers are those over
// raw readings.
func TestInstantLastOverTimeFromSummaries(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	windowData(t, dir, now)
	o := store.DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Now = func() time.Time { return now }
	st, err := store.Open(context.Background(), dir, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	src := &readCountingStore{countedStore: countedStore{Store: st}}
	fast, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw.q.noPushdown = true
	run := func(a *API, q string, at time.Time) promql.Vector {
		qry, err := a.engine.NewInstantQuery(context.Background(), a.q, nil, q, at)
		require.NoError(t, err)
		defer qry.Close()
		res := qry.Exec(context.Background())
		require.NoError(t, res.Err, q)
		v, err := res.Vector()
		require.NoError(t, err)
		return slices.Clone(v)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, q := range []string{`last_over_time(temp[6h])`, `last_over_time({__name__=~"temp|hum"}[1m])`,
		`last_over_time(temp[90s]) - last_over_time(hum[90s])`, `last_over_time(temp[1h] offset 5m)`} {
		for range 40 {
			at := now.Add(-time.Duration(rng.Int64N(int64(30 * time.Hour))))
			if rng.IntN(2) == 0 {
				at = at.Truncate(time.Minute) // window edges on readings
			}
			aggs, reads := src.aggregates.Load(), src.ranges.Load()+src.samples.Load()
			got := run(fast, q, at)
			require.Equal(t, reads, src.ranges.Load()+src.samples.Load(), "%s: no raw reads", q)
			if len(got) > 0 {
				require.Greater(t, src.aggregates.Load(), aggs, "%s: summaries", q)
			}
			want := run(raw, q, at)
			require.Equal(t, want, got, "%s at %s", q, at)
		}
	}
}
