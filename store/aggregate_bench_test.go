package store

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// thirtyDays is one device reporting every 10 s for 30 days (259,200
// readings of a temperature, a humidity and a battery level with two
// decimals, like the simulator's), written 100 readings per Write with
// the clock following the data, so every day is written while hot and
// compacted as it turns cold. The store is reopened after a clean
// Close. maxOpen is Options.MaxOpenTables.
func thirtyDays(tb testing.TB, maxOpen int) (*testStore, buckets.AggregateQuery) {
	tb.Helper()
	clock := newTestClock()
	first := today - 29
	clock.t = first.Start().Time()
	ts := openTestStore(tb, tb.TempDir(), clock, func(o *Options) { o.MaxOpenTables = maxOpen })
	rng := rand.New(rand.NewPCG(7, 7))
	temp, hum, bat := 21.0, 45.0, 100.0
	step := 10 * time.Second
	batch := make([]buckets.Reading, 0, 100)
	for i := range 30 * 8640 {
		t := first.Start().Time().Add(time.Duration(i) * step)
		temp += 0.05 * rng.NormFloat64()
		hum = min(max(hum+1.5*rng.NormFloat64(), 0), 100)
		bat = max(bat-0.001, 5)
		batch = append(batch, buckets.Reading{Device: "dev", Ticks: buckets.MustTicks(t), Values: []buckets.Field{
			{Name: "battery", Value: buckets.Float(math.Round(bat*100) / 100)},
			{Name: "humidity", Value: buckets.Float(math.Round(hum*100) / 100)},
			{Name: "temp", Value: buckets.Float(math.Round(temp*100) / 100)},
		}})
		if len(batch) == cap(batch) {
			clock.mu.Lock()
			clock.t = t
			clock.mu.Unlock()
			require.NoError(tb, ts.Write(context.Background(), batch))
			batch = batch[:0]
		}
	}
	ts = ts.reopen(tb)
	q := buckets.AggregateQuery{Device: "dev", From: first.Start(), To: today.End(),
		Interval: buckets.Ticks(time.Hour / 100), Limit: 1000}
	return ts, q
}

// BenchmarkAggregateThirtyDays: 1-hour buckets over 30 days of one
// device at 10 s (720 buckets from 720 block headers).
func BenchmarkAggregateThirtyDays(b *testing.B) {
	ts, q := thirtyDays(b, 32)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p, err := ts.Aggregate(ctx, q)
		if err != nil || len(p.Buckets) != 720 {
			b.Fatalf("%d buckets, %v", len(p.Buckets), err)
		}
	}
}

// TestAggregateThirtyDaysLatency measures the p99 of the query of
// BenchmarkAggregateThirtyDays (acceptance: at most 5 ms). It asserts
// the bound only with TELEMETRY_LONG=1, on a quiet machine.
func TestAggregateThirtyDaysLatency(t *testing.T) {
	if os.Getenv("TELEMETRY_LONG") != "1" { // the latency bound wants the machine to itself
		t.Parallel()
	}
	if testing.Short() {
		t.Skip("writes 259,200 readings")
	}
	ts, q := thirtyDays(t, 32)
	ctx := context.Background()
	start := time.Now()
	_, err := ts.Aggregate(ctx, q) // opens the 30 day tables
	require.NoError(t, err)
	t.Logf("first query, opening 30 day tables: %s", time.Since(start))
	var lat []time.Duration
	for range 300 {
		start := time.Now()
		p, err := ts.Aggregate(ctx, q)
		lat = append(lat, time.Since(start))
		require.NoError(t, err)
		require.Len(t, p.Buckets, 720)
		require.Equal(t, int64(360), p.Buckets[5].Values[0].Summary.Count)
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	t.Logf("aggregate 30 days, 1-hour buckets: p50 %s p99 %s max %s", p50, p99, lat[len(lat)-1])
	if os.Getenv("TELEMETRY_LONG") == "1" {
		require.LessOrEqual(t, p99, 5*time.Millisecond)
	}
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	var bytes int64
	for _, tb := range tables {
		bytes += tb.SizeBytes
	}
	t.Logf("disk after a clean stop: %d bytes, %.2f B/reading", bytes, float64(bytes)/float64(30*8640))
}

// fleetDay is devs devices reporting one temperature every 10 s for
// one day, written one device per Write, then reopened so every block
// is sealed (one-hour blocks).
func fleetDay(tb testing.TB, devs int) *testStore {
	tb.Helper()
	ts := openTestStore(tb, tb.TempDir(), newTestClock())
	day := today - 1
	rs := make([]buckets.Reading, 8640)
	for d := range devs {
		dev := buckets.DeviceID(fmt.Sprintf("fleet-%04d", d))
		for i := range rs {
			k := day.Start() + buckets.Ticks(i)*buckets.Ticks(10*time.Second/100)
			rs[i] = buckets.Reading{Device: dev, Ticks: k, Values: []buckets.Field{
				{Name: "temp", Value: buckets.Float(float64(d%50) + float64(i%60)/6)}}}
		}
		require.NoError(tb, ts.Write(context.Background(), rs))
	}
	return ts.reopen(tb)
}

// BenchmarkAggregateFleetDay: 5-minute buckets of one value over one
// day of a device at 10 s, sealed into one-hour blocks (the store side
// of a fleet dashboard's max_over_time(temp[5m]) per device); one op is
// one device.
func BenchmarkAggregateFleetDay(b *testing.B) {
	const devs = 100
	ts := fleetDay(b, devs)
	day := today - 1
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		q := buckets.AggregateQuery{Device: buckets.DeviceID(fmt.Sprintf("fleet-%04d", i%devs)), From: day.Start(), To: day.End(),
			Interval: buckets.Ticks(5 * time.Minute / 100), Fields: []string{"temp"}, Limit: 1000}
		i++
		p, err := ts.Aggregate(ctx, q)
		if err != nil || len(p.Buckets) != 288 {
			b.Fatalf("%d buckets, %v", len(p.Buckets), err)
		}
	}
}

// BenchmarkAggregateThirtyDaysPerMillisecond: the query of
// BenchmarkAggregateThirtyDays for one value, one value per
// millisecond (as the PromQL API asks): the blocks say that no two of
// their readings share a millisecond, so their headers still serve.
func BenchmarkAggregateThirtyDaysPerMillisecond(b *testing.B) {
	ts, q := thirtyDays(b, 32)
	q.Fields, q.PerMillisecond = []string{"temp"}, true
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p, err := ts.Aggregate(ctx, q)
		if err != nil || len(p.Buckets) != 720 {
			b.Fatalf("%d buckets, %v", len(p.Buckets), err)
		}
	}
}
