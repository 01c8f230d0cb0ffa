package store

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/retention"
)

// openYearStore opens a store holding a year of one device at one
// reading a minute, with rollups 1m:90d,1h:3y and the day tables of the
// last 30 days only (retention dropped the rest).
func openYearStore(b *testing.B) (*Store, buckets.Ticks, buckets.Ticks) {
	b.Helper()
	ctx := context.Background()
	dir := b.TempDir()
	clock := newTestClock()
	o := DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Now = clock.Now
	withRollups(&o)
	s, err := Open(ctx, dir, o)
	require.NoError(b, err)
	b.Cleanup(func() { _ = s.Close() })
	h := buckets.Ticks(time.Hour / 100)
	to := today.Start()
	from := to - 365*24*h
	for i := range 365 * 24 {
		rs := rollupSeries("dev-1", from+buckets.Ticks(i)*h+5*buckets.TicksPerSecond, time.Minute, i*60, 60)
		require.NoError(b, s.Write(ctx, rs))
		if i%24 == 23 {
			s.compactAll(false)
		}
	}
	s.compactAll(true)
	w, err := retention.NewWorker(s, retention.Config{Policy: retention.Policy{Retention: 30 * 24 * time.Hour}, Now: clock.Now})
	require.NoError(b, err)
	rep, err := w.RunOnce(ctx, false)
	require.NoError(b, err)
	require.Len(b, rep.Dropped, 365-30)
	return s, from, to
}

// BenchmarkYearHourlyChart times the query of a year-long chart at one
// point an hour (8,760 buckets of every value of a device), the store
// read behind GET /v1/devices/{device}/aggregates?interval=1h: 335 days
// from rollups alone, 30 from rollups and the day tables' last hours.
// It reports the 99th percentile of the iterations.
//
//	go test ./store -run '^$' -bench BenchmarkYearHourlyChart -benchtime 300x
func BenchmarkYearHourlyChart(b *testing.B) {
	s, from, to := openYearStore(b)
	ctx := context.Background()
	q := buckets.AggregateQuery{Device: "dev-1", From: from, To: to, Interval: buckets.Ticks(time.Hour / 100), Limit: 10000}
	p, err := s.Aggregate(ctx, q)
	require.NoError(b, err)
	require.Len(b, p.Buckets, 365*24)
	took := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if _, err := s.Aggregate(ctx, q); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)*99/100])/1e6, "p99-ms")
	b.ReportMetric(float64(took[len(took)/2])/1e6, "p50-ms")
}
