package api_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// The query benchmarks go through the whole read path as the service
// runs it: a real store on disk with sealed one-hour blocks, the Echo
// server on loopback HTTP, and a client that reads every byte of each
// answer. Readings have the shape of telemetry-bench's (an int, a bool
// and a two-decimal float) at one reading per second.
const (
	queryDevices   = 20
	queryPerDevice = 10_000
)

var queryBase = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

// queryServer fills a store, closes and reopens it so every block is
// sealed, and serves it over loopback HTTP. It returns the base URL.
func queryServer(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	opts := store.DefaultOptions()
	opts.Logger = slog.New(slog.DiscardHandler)
	opts.Now = func() time.Time { return queryBase.Add(4 * time.Hour) }
	ctx := context.Background()
	st, err := store.Open(ctx, dir, opts)
	require.NoError(b, err)
	batch := make([]buckets.Reading, 0, 10*queryDevices)
	for i := 0; i < queryPerDevice; i += 10 {
		for d := range queryDevices {
			for j := i; j < i+10; j++ {
				k := buckets.MustTicks(queryBase.Add(time.Duration(j) * time.Second))
				batch = append(batch, buckets.Reading{Device: queryDevice(d), Ticks: k, Values: []buckets.Field{
					{Name: "hum", Value: buckets.Int(int64(30 + j%40))},
					{Name: "ok", Value: buckets.Bool(j%5 != 0)},
					{Name: "temp", Value: buckets.Float(float64(1800+(j*37)%1000) / 100)},
				}})
			}
		}
		require.NoError(b, st.Write(ctx, batch))
		batch = batch[:0]
	}
	require.NoError(b, st.Close())
	st, err = store.Open(ctx, dir, opts)
	require.NoError(b, err)
	b.Cleanup(func() { _ = st.Close() })
	srv, err := api.New(api.Config{Reader: st, Logger: slog.New(slog.DiscardHandler), Now: opts.Now,
		CursorKey: []byte("bench cursor key")})
	require.NoError(b, err)
	hs := httptest.NewServer(srv.Handler())
	b.Cleanup(hs.Close)
	return hs.URL
}

func queryDevice(d int) buckets.DeviceID { return buckets.DeviceID(fmt.Sprintf("dev-%03d", d)) }

// benchGets runs b.N requests for the paths next makes, reading each
// answer whole, and reports the p50 and p99 latency and the body size.
func benchGets(b *testing.B, next func() string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	buf := make([]byte, 64<<10)
	get := func() (int, error) {
		res, err := client.Get(next())
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		n := 0
		for {
			m, err := res.Body.Read(buf)
			n += m
			if err == io.EOF {
				break
			}
			if err != nil {
				return n, err
			}
		}
		if res.StatusCode != http.StatusOK {
			return n, fmt.Errorf("status %d", res.StatusCode)
		}
		return n, nil
	}
	if _, err := get(); err != nil { // warm the connection
		b.Fatal(err)
	}
	var lat []time.Duration
	size := 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		n, err := get()
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		size = n
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(size), "bytes/answer")
}

// BenchmarkQueryRangeOneHour: one hour (3,600 readings, in one page) of
// a random device from a random second, as telemetry-bench asks it.
func BenchmarkQueryRangeOneHour(b *testing.B) {
	url := queryServer(b)
	rng := rand.New(rand.NewPCG(1, 2))
	benchGets(b, func() string {
		from := queryBase.Add(time.Duration(rng.IntN(queryPerDevice-3600)) * time.Second)
		return fmt.Sprintf("%s/v1/devices/%s/readings?from=%d&to=%d&limit=3600", url,
			queryDevice(rng.IntN(queryDevices)), from.UnixMilli(), from.Add(time.Hour).UnixMilli())
	})
}

// BenchmarkQueryLatest10: the newest 10 readings of a random device.
func BenchmarkQueryLatest10(b *testing.B) {
	url := queryServer(b)
	rng := rand.New(rand.NewPCG(1, 2))
	benchGets(b, func() string {
		return fmt.Sprintf("%s/v1/devices/%s/readings/latest?limit=10", url, queryDevice(rng.IntN(queryDevices)))
	})
}
