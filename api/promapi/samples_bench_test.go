package promapi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// fleetTrucks and fleetHours shape the benchmark's fleet: TSBS IoT
// trucks, each a reading of 16 values every 10 s.
const (
	fleetTrucks = 100
	fleetHours  = 6
)

// fleetNames are the TSBS IoT fields, as the line protocol door names
// them.
var fleetNames = []string{
	"diagnostics.current_load", "diagnostics.fuel_capacity", "diagnostics.fuel_state", "diagnostics.load_capacity",
	"diagnostics.nominal_fuel_consumption", "diagnostics.status", "readings.elevation", "readings.fuel_capacity",
	"readings.fuel_consumption", "readings.grade", "readings.heading", "readings.latitude", "readings.load_capacity",
	"readings.longitude", "readings.nominal_fuel_consumption", "readings.velocity",
}

// fleetStore writes the fleet, ten minutes of every truck per write,
// and reopens the store so its blocks are sealed.
func fleetStore(b *testing.B, now time.Time, opts ...func(*store.Options)) *store.Store {
	b.Helper()
	dir := b.TempDir()
	open := func() *store.Store {
		o := store.DefaultOptions()
		for _, f := range opts {
			f(&o)
		}
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		o.Now = func() time.Time { return now }
		st, err := store.Open(context.Background(), dir, o)
		require.NoError(b, err)
		return st
	}
	st := open()
	rng := rand.New(rand.NewPCG(1, 2))
	start := buckets.MustTicks(now.Add(-fleetHours * time.Hour))
	step := buckets.Ticks(10 * time.Second / 100)
	var batch []buckets.Reading
	for k := start; k < buckets.MustTicks(now); k += 60 * step {
		batch = batch[:0]
		for d := range fleetTrucks {
			for j := range buckets.Ticks(60) {
				fs := make([]buckets.Field, len(fleetNames))
				for i, n := range fleetNames {
					fs[i] = buckets.Field{Name: n, Value: buckets.Float(float64(rng.IntN(10000)) / 100)}
				}
				batch = append(batch, buckets.Reading{Device: buckets.DeviceID(fmt.Sprintf("truck_%d", d)), Ticks: k + j*step, Values: fs})
			}
		}
		require.NoError(b, st.Write(context.Background(), batch))
	}
	require.NoError(b, st.Close())
	st = open()
	b.Cleanup(func() { _ = st.Close() })
	return st
}

// BenchmarkFleetQuestions answers fleet questions (api/FLEET-QUERIES.md,
// over every truck) as instant queries at the data's newest time: as
// the API answers them (default: summaries, projected reads, the
// column cache), without the store's column cache (nocache), and from
// pages of raw readings (raw).
func BenchmarkFleetQuestions(b *testing.B) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	st := fleetStore(b, now)
	uncached := fleetStore(b, now, func(o *store.Options) { o.ColumnCacheSize = -1 })
	for _, q := range []struct{ name, q string }{
		{"last_location", `last_over_time({__name__=~"readings\\.(latitude|longitude)"}[6h])`},
		{"high_load", `last_over_time({__name__="diagnostics.current_load"}[6h]) >= 0.9 * last_over_time({__name__="diagnostics.load_capacity"}[6h])`},
		{"average_load", `avg(avg_over_time({__name__="diagnostics.current_load"}[6h]) / avg_over_time({__name__="diagnostics.load_capacity"}[6h]))`},
		{"stationary", `avg_over_time({__name__="readings.velocity"}[10m]) < 1`},
		{"long_driving", `count_over_time((avg_over_time({__name__="readings.velocity"}[10m]) > 1)[4h:10m]) > 22`},
		{"daily_activity", `count_over_time((avg(avg_over_time({__name__="diagnostics.status"}[10m])) < 1)[1d:10m]) / 144`},
	} {
		for _, path := range []string{"raw", "default", "nocache"} {
			b.Run(q.name+"/"+path, func(b *testing.B) {
				src := st
				if path == "nocache" {
					src = uncached
				}
				a, err := New(Config{Source: src, Now: func() time.Time { return now }})
				require.NoError(b, err)
				a.q.noPushdown = path == "raw"
				b.ReportAllocs()
				for b.Loop() {
					qry, err := a.newInstantQuery(context.Background(), q.q, now)
					require.NoError(b, err)
					res := qry.Exec(context.Background())
					require.NoError(b, res.Err)
					qry.Close()
				}
			})
		}
	}
}
