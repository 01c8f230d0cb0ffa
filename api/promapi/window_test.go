package promapi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// countedStore is the real store, counting raw reads and aggregate
// calls.
type countedStore struct {
	*store.Store
	ranges, aggregates atomic.Int64
}

func (s *countedStore) Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error) {
	s.ranges.Add(1)
	return s.Store.Range(ctx, q)
}

func (s *countedStore) Aggregate(ctx context.Context, q buckets.AggregateQuery) (buckets.AggregatePage, error) {
	s.aggregates.Add(1)
	return s.Store.Aggregate(ctx, q)
}

// windowData writes readings that make window answers hard: readings on
// window edges (left-open windows drop them), several readings in one
// millisecond (a series has one sample per millisecond: the newest),
// ints, bools, strings and absent values under the queried name,
// rewritten and late readings (blocks that overlap), across a day
// boundary; then the store is reopened so older blocks are sealed, and
// more is written after that.
func windowData(t *testing.T, dir string, now time.Time) {
	t.Helper()
	open := func() *store.Store {
		o := store.DefaultOptions()
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		o.Now = func() time.Time { return now }
		st, err := store.Open(context.Background(), dir, o)
		require.NoError(t, err)
		return st
	}
	rng := rand.New(rand.NewPCG(10, 10))
	start := now.Add(-30 * time.Hour).Truncate(time.Hour)
	ms := buckets.Ticks(time.Millisecond / 100)
	value := func() buckets.Value {
		switch rng.IntN(12) {
		case 0:
			return buckets.Int(rng.Int64N(100) - 50)
		case 1:
			return buckets.Bool(rng.IntN(2) == 0)
		case 2:
			return buckets.String("n/a")
		}
		return buckets.Float(math.Round(rng.NormFloat64()*1000) / 100)
	}
	reading := func(dev string, k buckets.Ticks) buckets.Reading {
		fs := []buckets.Field{{Name: "hum", Value: buckets.Float(float64(rng.IntN(100)))}}
		if rng.IntN(10) > 0 {
			fs = append(fs, buckets.Field{Name: "temp", Value: value()})
		}
		return buckets.Reading{Device: buckets.DeviceID(dev), Ticks: k, Values: fs}
	}
	write := func(st *store.Store, rs []buckets.Reading) {
		for i := 0; i < len(rs); i += 700 {
			require.NoError(t, st.Write(context.Background(), rs[i:min(i+700, len(rs))]))
		}
	}
	devs := []string{"w-0", "w-1", "w-2"}
	st := open()
	for di, dev := range devs {
		var rs []buckets.Reading
		k := buckets.MustTicks(start)
		for k < buckets.MustTicks(now) {
			r := reading(dev, k)
			rs = append(rs, r)
			switch rng.IntN(20) {
			case 0: // a second reading in the same millisecond
				rs = append(rs, reading(dev, k+1+buckets.Ticks(rng.Int64N(int64(ms)-1))))
			case 1: // one in the next tick, the first of its millisecond when k ends one
				rs = append(rs, reading(dev, k+ms-k%ms))
			}
			// Steps of whole seconds from an edge, so many readings sit on
			// window edges; every device a little differently.
			step := time.Duration(5+di+rng.IntN(20)) * time.Second
			k += buckets.Ticks(step / 100)
		}
		write(st, rs)
	}
	require.NoError(t, st.Close())
	st = open() // sealed blocks
	var late []buckets.Reading
	for range 300 {
		dev := devs[rng.IntN(len(devs))]
		k := buckets.MustTicks(start.Add(time.Duration(rng.Int64N(int64(30 * time.Hour)))))
		if rng.IntN(2) == 0 {
			k -= k % buckets.Ticks(time.Minute/100) // on a window edge
		}
		late = append(late, reading(dev, k))
	}
	write(st, late)
	require.NoError(t, st.Close())
}

// TestWindowPushdownMatchesTheEngineOverRawSamples compares every query
// answered from per-window summaries with the engine's answer over
// every raw sample: counts, minima and maxima exactly, sums and
// averages within rounding.
func TestWindowPushdownMatchesTheEngineOverRawSamples(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	windowData(t, dir, now)
	o := store.DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Now = func() time.Time { return now }
	st, err := store.Open(context.Background(), dir, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	src := &countedStore{Store: st}
	pushed, err := New(Config{Source: src, Now: func() time.Time { return now }})
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
		out := make(promql.Matrix, len(m)) // Close hands the points back to the engine's pools
		for i, s := range m {
			out[i] = promql.Series{Metric: s.Metric, Floats: slices.Clone(s.Floats)}
		}
		return out
	}
	rng := rand.New(rand.NewPCG(3, 4))
	fns := []string{"avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time"}
	pushedQueries := 0
	for _, c := range []struct {
		rng, step time.Duration
	}{
		{time.Minute, time.Minute}, {5 * time.Minute, 5 * time.Minute}, {time.Hour, time.Hour},
		{time.Minute, 3 * time.Minute}, {90 * time.Second, 90 * time.Second}, {time.Second, time.Second},
		{10 * time.Second, 10 * time.Second}, {2500 * time.Millisecond, 2500 * time.Millisecond},
		{time.Minute, 30 * time.Second}, // overlapping windows: never pushed down
	} {
		for _, fn := range fns {
			for _, sel := range []string{`temp`, `temp{device="w-1"}`} {
				q := fmt.Sprintf("%s(%s[%dms])", fn, sel, c.rng.Milliseconds())
				if fn == "max_over_time" && sel == "temp" {
					q = fmt.Sprintf("max by (device) (%s)", q)
				}
				// Steps aligned as Grafana sends them, and some not.
				span := min(c.step*200, 26*time.Hour)
				from := now.Add(-time.Duration(rng.Int64N(int64(28*time.Hour-span))) - span).Truncate(c.step)
				if rng.IntN(4) == 0 {
					from = from.Add(time.Duration(rng.Int64N(int64(c.step))))
				}
				to := from.Add(span)
				before := src.ranges.Load()
				got := run(pushed, q, from, to, c.step)
				if src.ranges.Load() == before {
					pushedQueries++
				}
				want := run(raw, q, from, to, c.step)
				require.NotEmpty(t, want, q)
				sameMatrix(t, q, want, got)
			}
		}
	}
	require.Greater(t, pushedQueries, 40, "most queries are answered from summaries")
}

// sameMatrix fails unless got has the series and points of want, with
// equal values (sums and averages within rounding).
func sameMatrix(t *testing.T, q string, want, got promql.Matrix) {
	t.Helper()
	require.Equal(t, len(want), len(got), "%s: series", q)
	for i := range want {
		w, g := want[i], got[i]
		require.Equal(t, w.Metric, g.Metric, "%s: series %d", q, i)
		require.Equal(t, len(w.Floats), len(g.Floats), "%s %s: points", q, w.Metric)
		for j := range w.Floats {
			wp, gp := w.Floats[j], g.Floats[j]
			require.Equal(t, wp.T, gp.T, "%s %s: point %d", q, w.Metric, j)
			if wp.F == gp.F {
				continue
			}
			if math.Abs(wp.F-gp.F) > 1e-9*math.Abs(wp.F) {
				for k := max(0, j-2); k < min(len(w.Floats), j+3); k++ {
					t.Logf("DBG %s want %v got %v", time.UnixMilli(w.Floats[k].T).UTC(), w.Floats[k].F, g.Floats[k].F)
				}
			}
			require.InEpsilon(t, wp.F, gp.F, 1e-9, "%s %s at %s", q, w.Metric, time.UnixMilli(wp.T).UTC())
			require.NotContains(t, q, "min_over_time", "%s %s at %s: %v want %v", q, w.Metric, time.UnixMilli(wp.T).UTC(), gp.F, wp.F)
			require.NotContains(t, q, "max_over_time", "%s %s at %s: %v want %v", q, w.Metric, time.UnixMilli(wp.T).UTC(), gp.F, wp.F)
			require.NotContains(t, q, "count_over_time", "%s %s at %s: %v want %v", q, w.Metric, time.UnixMilli(wp.T).UTC(), gp.F, wp.F)
		}
	}
}

// TestInstantWindowsMatchTheEngineOverRawSamples compares instant
// queries of every function answered from a window's summary with the
// engine's answer over every raw sample, at times on and off window
// edges, with windows shorter than a block and windows over many blocks
// and the day boundary.
func TestInstantWindowsMatchTheEngineOverRawSamples(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	windowData(t, dir, now)
	o := store.DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Now = func() time.Time { return now }
	st, err := store.Open(context.Background(), dir, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	src := &countedStore{Store: st}
	pushed, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw.q.noPushdown = true

	run := func(a *API, q string, at time.Time) promql.Matrix {
		qry, err := a.engine.NewInstantQuery(context.Background(), a.q, nil, q, at)
		require.NoError(t, err)
		defer qry.Close()
		res := qry.Exec(context.Background())
		require.NoError(t, res.Err, q)
		v, err := res.Vector()
		require.NoError(t, err, q)
		out := make(promql.Matrix, len(v))
		for i, s := range v {
			out[i] = promql.Series{Metric: s.Metric, Floats: []promql.FPoint{{T: s.T, F: s.F}}}
		}
		return out
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, fn := range []string{"avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "last_over_time"} {
		for _, r := range []time.Duration{time.Second, 10 * time.Second, time.Minute, 10 * time.Minute, time.Hour, 6 * time.Hour, 20 * time.Hour} {
			for range 4 {
				at := now.Add(-time.Duration(rng.Int64N(int64(28*time.Hour - r))))
				if rng.IntN(2) == 0 {
					at = at.Truncate(time.Minute) // the window's edges on readings
				}
				q := fmt.Sprintf("%s(temp[%dms])", fn, r.Milliseconds())
				before, aggs := src.ranges.Load(), src.aggregates.Load()
				got := run(pushed, q, at)
				require.Equal(t, before, src.ranges.Load(), "%s at %s: no raw reads", q, at)
				require.Greater(t, src.aggregates.Load(), aggs, "%s at %s: answered from summaries", q, at)
				want := run(raw, q, at)
				sameMatrix(t, q, want, got)
			}
		}
	}
}

// TestSubqueryWindowsMatchTheEngineOverRawSamples compares queries
// whose selects sit in subqueries, instant and range, at times that are
// not multiples of the subquery's step: the selects are answered per
// window on the subquery's steps, and must equal the engine's answer
// over every raw sample; with an offset they are read raw.
func TestSubqueryWindowsMatchTheEngineOverRawSamples(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	windowData(t, dir, now)
	o := store.DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Now = func() time.Time { return now }
	st, err := store.Open(context.Background(), dir, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	src := &countedStore{Store: st}
	pushed, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw.q.noPushdown = true

	matrixOf := func(v any) promql.Matrix {
		switch v := v.(type) {
		case promql.Vector:
			out := make(promql.Matrix, len(v))
			for i, s := range v {
				out[i] = promql.Series{Metric: s.Metric, Floats: []promql.FPoint{{T: s.T, F: s.F}}}
			}
			slices.SortFunc(out, func(a, b promql.Series) int { return labels.Compare(a.Metric, b.Metric) })
			return out
		case promql.Matrix:
			out := make(promql.Matrix, len(v))
			for i, s := range v {
				out[i] = promql.Series{Metric: s.Metric, Floats: slices.Clone(s.Floats)}
			}
			return out
		}
		t.Fatalf("result %T", v)
		return nil
	}
	run := func(a *API, q string, at time.Time, span, step time.Duration) promql.Matrix {
		var qry promql.Query
		var err error
		if span == 0 {
			qry, err = a.newInstantQuery(context.Background(), q, at)
		} else {
			qry, err = a.newRangeQuery(context.Background(), q, at.Add(-span), at, step)
		}
		require.NoError(t, err)
		defer qry.Close()
		res := qry.Exec(context.Background())
		require.NoError(t, res.Err, q)
		return matrixOf(res.Value)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for _, c := range []struct {
		q      string
		pushed bool
	}{
		{`count_over_time((avg_over_time(temp[10m]) > 0)[4h:10m])`, true},
		{`sum_over_time(max_over_time(temp[1m])[2h:5m])`, true},
		{`max_over_time(min_over_time(temp{device="w-1"}[90s])[3h:90s])`, true},
		{`avg by (device) (sum_over_time(avg_over_time(temp[1m])[1h:1m]))`, true},
		{`max_over_time(count_over_time(avg_over_time(temp[1m])[30m:1m])[2h:10m])`, true},
		{`count_over_time((avg_over_time(temp[10m] offset 7m) > 0)[4h:10m])`, false},
		{`count_over_time((avg_over_time(temp[10m]) > 0)[4h:10m] offset 3m)`, false},
	} {
		for _, span := range []time.Duration{0, 0, time.Hour} {
			at := now.Add(-time.Duration(rng.Int64N(int64(20 * time.Hour))))
			if span > 0 && rng.IntN(2) == 0 {
				at = at.Truncate(time.Minute)
			}
			before := src.ranges.Load()
			got := run(pushed, c.q, at, span, 7*time.Minute)
			if c.pushed {
				require.Equal(t, before, src.ranges.Load(), "%s at %s over %s: answered from summaries", c.q, at, span)
			}
			want := run(raw, c.q, at, span, 7*time.Minute)
			require.NotEmpty(t, want, c.q)
			sameMatrix(t, c.q, want, got)
		}
	}
}

// TestWindowsOfADeviceAreReadTogether checks that the pushed-down
// series of one device that share their windows, in one selector or in
// several, are read with one store call per device, and still answer
// as the engine does over raw samples.
func TestWindowsOfADeviceAreReadTogether(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	windowData(t, dir, now)
	o := store.DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Now = func() time.Time { return now }
	st, err := store.Open(context.Background(), dir, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	src := &countedStore{Store: st}
	pushed, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw.q.noPushdown = true
	run := func(a *API, q string) promql.Vector {
		qry, err := a.newInstantQuery(context.Background(), q, now.Add(-3*time.Hour))
		require.NoError(t, err)
		defer qry.Close()
		res := qry.Exec(context.Background())
		require.NoError(t, res.Err, q)
		v, err := res.Vector()
		require.NoError(t, err)
		v = slices.Clone(v)
		slices.SortFunc(v, func(a, b promql.Sample) int { return labels.Compare(a.Metric, b.Metric) })
		return v
	}
	for _, q := range []string{
		`last_over_time({__name__=~"temp|hum"}[6h])`,
		`avg_over_time(temp[6h]) / on (device) avg_over_time(hum[6h])`,
		`count_over_time((avg_over_time(temp[10m]) > 0)[4h:10m]) + on (device) count_over_time((avg_over_time(hum[10m]) > 50)[4h:10m])`,
	} {
		before := src.aggregates.Load()
		got := run(pushed, q)
		assert.Equal(t, int64(3), src.aggregates.Load()-before, "%s: one store call per device", q)
		want := run(raw, q)
		require.Equal(t, len(want), len(got), q)
		for i := range want {
			require.Equal(t, want[i].Metric, got[i].Metric, q)
			require.InEpsilon(t, want[i].F, got[i].F, 1e-9, "%s %s", q, want[i].Metric)
		}
	}
}

// TestGridDenseAndSparseAgree: a grid too long for a slice keeps its
// buckets in a map and answers exactly as a slice does, for bucket
// starts inside, outside and between its buckets.
func TestGridDenseAndSparseAgree(t *testing.T) {
	r := buckets.Ticks(time.Minute / 100)
	from := buckets.MustTicks(time.Date(2026, 11, 22, 0, 0, 30, 0, time.UTC)) // inside a bucket
	to := from + 100*r
	dense := newGrid(from, to, r)
	require.NotNil(t, dense.dense)
	sparse := grid{base: dense.base, r: r, sparse: map[buckets.Ticks]buckets.Summary{}}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 60 {
		x := dense.base + buckets.Ticks(rng.IntN(101))*r // the buckets an aggregate over [from, to) returns
		s := buckets.Summary{Count: int64(rng.IntN(9) + 1), Sum: rng.Float64()}
		dense.set(x, s)
		sparse.set(x, s)
	}
	for k := dense.base - 3*r; k < to+3*r; k += r / 2 {
		require.Equal(t, sparse.at(k), dense.at(k), "bucket at %s", k.FormatTime())
	}
	require.Equal(t, buckets.Summary{}, dense.at(dense.base+r/2), "not a bucket start")
	require.Nil(t, newGrid(from, from+(maxDenseGrid+5)*r, r).dense, "a long grid keeps a map")
}
