package promapi

import (
	"context"
	"io"
	"log/slog"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
	"github.com/telemetryd/telemetryd/store/rollup"
)

// TestPushdownReadsRollupsOnceTheDaysAreDropped: avg_over_time and
// max_over_time of 30 days at a 1h step give the same points, bit for
// bit, from the day tables alone and, once retention dropped them, from
// the hourly rollup; both agree with the engine over the raw samples.
func TestPushdownReadsRollupsOnceTheDaysAreDropped(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 259,200 readings")
	}
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	levels := []rollup.Level{{Interval: time.Minute, Retention: 90 * rollup.Day}, {Interval: time.Hour, Retention: 3 * rollup.Year}}
	open := func(ls []rollup.Level) *store.Store {
		o := store.DefaultOptions()
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		o.Now = func() time.Time { return now }
		o.Rollups = ls
		st, err := store.Open(context.Background(), dir, o)
		require.NoError(t, err)
		return st
	}
	ctx := context.Background()
	first := now.Truncate(24*time.Hour).AddDate(0, 0, -31)
	st := open(levels)
	for h := range 30 * 24 {
		rs := make([]buckets.Reading, 360)
		for j := range rs {
			i := h*360 + j
			k := buckets.MustTicks(first.Add(time.Duration(i)*10*time.Second + 5*time.Second))
			rs[j] = buckets.Reading{Device: "p-1", Ticks: k, Values: []buckets.Field{
				{Name: "temp", Value: buckets.Float(20 + 3*math.Sin(float64(i)/500) + 0.01*float64(i%7))}}}
		}
		require.NoError(t, st.Write(ctx, rs))
	}
	require.NoError(t, st.Close())

	run := func(a *API, q string) promql.Matrix {
		from, to := first.Add(time.Hour), first.Add(30*24*time.Hour)
		qry, err := a.engine.NewRangeQuery(ctx, a.q, nil, q, from, to, time.Hour)
		require.NoError(t, err)
		defer qry.Close()
		res := qry.Exec(ctx)
		require.NoError(t, res.Err, q)
		m, err := res.Matrix()
		require.NoError(t, err)
		out := make(promql.Matrix, len(m))
		for i, s := range m {
			out[i] = promql.Series{Metric: s.Metric, Floats: slices.Clone(s.Floats)}
		}
		return out
	}
	queries := []string{`avg_over_time(temp{device="p-1"}[1h])`, `max_over_time(temp{device="p-1"}[1h])`}

	st = open(nil) // the day tables alone
	src := &countedStore{Store: st}
	pushed, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	raw.q.noPushdown = true
	before := make(map[string]promql.Matrix)
	for _, q := range queries {
		before[q] = run(pushed, q)
		require.Len(t, before[q], 1, q)
		require.Equal(t, 30*24, len(before[q][0].Floats), q)
		sameMatrix(t, q, run(raw, q), before[q])
	}
	require.NoError(t, st.Close())

	st = open(levels)
	t.Cleanup(func() { _ = st.Close() })
	for d := buckets.DayOfTime(first); d < buckets.DayOfTime(first)+30; d++ {
		_, err := st.DropTable(ctx, d)
		require.NoError(t, err)
	}
	tables, err := st.Tables(ctx)
	require.NoError(t, err)
	require.Empty(t, tables)
	src = &countedStore{Store: st}
	pushed, err = New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	for _, q := range queries {
		assert.Equal(t, before[q], run(pushed, q), q)
	}
	assert.Zero(t, src.ranges.Load(), "nothing read raw")
}
