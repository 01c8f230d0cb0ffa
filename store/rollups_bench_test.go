package store

import (
	"context"
	"io"
	"io/fs"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/retention"
	"github.com/telemetryd/telemetryd/store/rollup"
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
	w, err := retention.NewWorker(s, retention.Config{Policy: retention.Policy{Retention: 30 * 24 * time.Hour}, Now: clock.Now, Logger: o.Logger})
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
// It reports the 50th and 99th percentiles of the iterations and the
// process's CPU time per query (with the garbage collector's).
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
	cpu0 := processCPU(b)
	for b.Loop() {
		t0 := time.Now()
		if _, err := s.Aggregate(ctx, q); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(t0))
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU(b)-cpu0)/1e6/float64(len(took)), "cpu-ms/op")
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)*99/100])/1e6, "p99-ms")
	b.ReportMetric(float64(took[len(took)/2])/1e6, "p50-ms")
}

// BenchmarkRollupDisk measures the disk a year of one device's rollups
// takes (four numeric values, one reading a minute): per level, the
// bytes of its databases' tables (SSTables) after a close, per bucket
// and per bucket and value. The 1m level keeps 90 days, so its figure
// is over what retention left.
//
//	go test ./store -run '^$' -bench BenchmarkRollupDisk -benchtime 1x
func BenchmarkRollupDisk(b *testing.B) {
	s, from, to := openYearStore(b)
	ctx := context.Background()
	counts := make([]int, len(s.rollups.set.Levels()))
	for i := range counts {
		require.NoError(b, s.rollups.set.Scan(ctx, i, "dev-1", from, to, func(rollup.Bucket) error { counts[i]++; return nil }))
	}
	dir := s.dir
	require.NoError(b, s.Close())
	for b.Loop() {
	}
	for i, l := range withRollupLevels() {
		var size int64
		require.NoError(b, filepath.WalkDir(filepath.Join(dir, rollupsDirName, l.Name()), func(p string, d fs.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(p, ".sst") {
				info, err := d.Info()
				if err == nil {
					size += info.Size()
				}
			}
			return err
		}))
		b.ReportMetric(float64(counts[i]), l.Name()+"-buckets")
		b.ReportMetric(float64(size)/float64(counts[i]), l.Name()+"-bytes/bucket")
		b.ReportMetric(float64(size)/float64(counts[i])/4, l.Name()+"-bytes/bucket/value")
	}
}

// withRollupLevels is the levels withRollups sets.
func withRollupLevels() []rollup.Level {
	var o Options
	withRollups(&o)
	return o.Rollups
}
