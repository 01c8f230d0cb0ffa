package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/retention"
	"github.com/telemetryd/telemetryd/store"
	"github.com/telemetryd/telemetryd/store/rollup"
)

// BenchmarkQueryYearHourlyChart is the year-long chart of
// store.BenchmarkYearHourlyChart through the HTTP API: a store with a
// year of one device at one reading a minute (four numeric values and a
// string), rollups 1m:90d,1h:3y and the day tables of the last 30 days
// only, asked GET /v1/devices/{device}/aggregates?interval=1h over the
// year (8,760 buckets, one page) on loopback, the client reading every
// byte: of the default count, min, max and avg of every value, and of
// min, max and avg of one value (what the built-in page asks for one
// chart).
//
//	go test ./api -run '^$' -bench BenchmarkQueryYearHourlyChart -benchtime 300x
func BenchmarkQueryYearHourlyChart(b *testing.B) {
	ctx := context.Background()
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	to := now.Truncate(24 * time.Hour)
	from := to.AddDate(0, 0, -365)
	opts := store.DefaultOptions()
	opts.Logger = slog.New(slog.DiscardHandler)
	opts.Now = func() time.Time { return now }
	opts.Rollups = []rollup.Level{{Interval: time.Minute, Retention: 90 * rollup.Day}, {Interval: time.Hour, Retention: 3 * rollup.Year}}
	dir := b.TempDir()
	st, err := store.Open(ctx, dir, opts)
	require.NoError(b, err)
	rs := make([]buckets.Reading, 60)
	for h := range 365 * 24 {
		for j := range rs {
			i := h*60 + j
			rs[j] = buckets.Reading{Device: "dev-1", Ticks: buckets.MustTicks(from.Add(time.Duration(i)*time.Minute + 5*time.Second)), Values: []buckets.Field{
				{Name: "load", Value: buckets.Float(math.Sin(float64(i)) * 3.7)},
				{Name: "mode", Value: buckets.String("auto")},
				{Name: "n", Value: buckets.Int(int64(i))},
				{Name: "ok", Value: buckets.Bool(i%3 == 0)},
				{Name: "temp", Value: buckets.Float(20 + 0.1*float64(i%97))},
			}}
		}
		require.NoError(b, st.Write(ctx, rs))
	}
	require.NoError(b, st.Close()) // rolls up every hour written
	st, err = store.Open(ctx, dir, opts)
	require.NoError(b, err)
	b.Cleanup(func() { _ = st.Close() })
	w, err := retention.NewWorker(st, retention.Config{Policy: retention.Policy{Retention: 30 * 24 * time.Hour}, Now: opts.Now, Logger: opts.Logger})
	require.NoError(b, err)
	rep, err := w.RunOnce(ctx, false)
	require.NoError(b, err)
	require.Len(b, rep.Dropped, 365-30)

	srv, err := api.New(api.Config{Reader: st, Aggregator: st, Logger: opts.Logger, Now: opts.Now, CursorKey: []byte("bench cursor key")})
	require.NoError(b, err)
	hs := httptest.NewServer(srv.Handler())
	b.Cleanup(hs.Close)
	for _, c := range []struct{ name, query string }{
		{"every-value", ""},
		// What the built-in page asks for one chart: one value's band.
		{"one-value-min-max-avg", "&fields=temp&fn=min,max,avg"},
	} {
		b.Run(c.name, func(b *testing.B) {
			url := fmt.Sprintf("%s/v1/devices/dev-1/aggregates?interval=1h&limit=10000&from=%d&to=%d%s", hs.URL, from.UnixMilli(), to.UnixMilli(), c.query)
			res, err := http.Get(url)
			require.NoError(b, err)
			var got struct {
				Buckets []json.RawMessage `json:"buckets"`
				Next    string            `json:"next"`
			}
			require.NoError(b, json.NewDecoder(res.Body).Decode(&got))
			res.Body.Close()
			require.Len(b, got.Buckets, 365*24)
			require.Empty(b, got.Next)
			benchGets(b, func() string { return url })
		})
	}
}
