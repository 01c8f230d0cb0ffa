package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// latencies runs do n times and returns the sorted durations.
func latencies(t *testing.T, n int, do func()) []time.Duration {
	t.Helper()
	out := make([]time.Duration, n)
	for i := range out {
		start := time.Now()
		do()
		out[i] = time.Since(start)
	}
	slices.Sort(out)
	return out
}

// pct is the p-th percentile (nearest rank) of sorted ds.
func pct(ds []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p/100*float64(len(ds)))) - 1
	return ds[max(i, 0)]
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) }

// httpGet fetches u and fails unless it answers 200.
func httpGet(t *testing.T, u string) []byte {
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", u, body)
	return body
}

// TestDashboardBenchmarks measures the dashboard queries of BENCHMARKS.md
// on the real store over HTTP (TELEMETRY_DASHBENCH=1; about two
// minutes):
//
//	TELEMETRY_DASHBENCH=1 go test ./cmd/telemetryd -run TestDashboardBenchmarks -v -timeout 30m
func TestDashboardBenchmarks(t *testing.T) {
	if os.Getenv("TELEMETRY_DASHBENCH") == "" {
		t.Skip("set TELEMETRY_DASHBENCH=1 to run the dashboard benchmarks")
	}
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	env := newDashEnv(t, now)
	env.queryTimeout = 2 * time.Minute
	// TELEMETRY_DASHBENCH_MAX_OPEN_TABLES is the service's -max-open-tables.
	env.maxOpenTables, _ = strconv.Atoi(os.Getenv("TELEMETRY_DASHBENCH_MAX_OPEN_TABLES"))
	env.reopen(t)
	start30 := now.Add(-30 * 24 * time.Hour)
	step := 10 * time.Second

	fill := time.Now()
	var rs []buckets.Reading
	for ts := start30; ts.Before(now); ts = ts.Add(step) {
		h := float64(ts.Unix()%86400) / 86400 * 2 * math.Pi
		rs = append(rs, newReading("d", buckets.MustTicks(ts), buckets.Field{Name: "temp", Value: buckets.Float(math.Round((21+4*math.Sin(h))*100) / 100)}))
		if len(rs) == 8640 {
			env.write(t, rs...)
			rs = rs[:0]
		}
	}
	env.write(t, rs...)
	start1 := now.Add(-24 * time.Hour)
	for d := range 1000 {
		rs = rs[:0]
		dev := fmt.Sprintf("fleet-%04d", d)
		for ts := start1; ts.Before(now); ts = ts.Add(step) {
			rs = append(rs, newReading(dev, buckets.MustTicks(ts), buckets.Field{Name: "temp", Value: buckets.Float(float64(d%50) + float64(ts.Unix()%600)/60)}))
		}
		env.write(t, rs...)
	}
	env.reopen(t) // every block sealed, as after the compactor caught up
	t.Logf("filled 259,200 + 8,640,000 readings in %s", time.Since(fill).Round(time.Second))

	from30, to := strconv.FormatInt(start30.UnixMilli(), 10), strconv.FormatInt(now.UnixMilli(), 10)
	aggURL := env.base + "/v1/devices/d/aggregates?" + url.Values{"from": {from30}, "to": {to}, "interval": {"1h"}, "fn": {"count,min,max,avg"}}.Encode()
	require.Contains(t, string(httpGet(t, aggURL)), `"count":360`)
	promRange := func(q string, from time.Time, st time.Duration) string {
		return env.base + "/api/v1/query_range?" + url.Values{"query": {q},
			"start": {strconv.FormatInt(from.Unix(), 10)}, "end": {strconv.FormatInt(now.Unix(), 10)},
			"step": {strconv.Itoa(int(st.Seconds()))}}.Encode()
	}
	avgURL := promRange(`avg_over_time(temp{device="d"}[1h])`, start30, time.Hour)
	fleetURL := promRange(`max by (device) (max_over_time(temp[5m]))`, start1, 5*time.Minute)

	// Baseline: the same 30 days as raw readings, paged 10,000 at a time
	// (what a chart had to do before), and one 1-hour raw range.
	rawAll := func() {
		q := url.Values{"from": {from30}, "to": {to}, "order": {"asc"}, "limit": {"10000"}, "fields": {"temp"}}
		for pages := 0; ; pages++ {
			body := httpGet(t, env.base+"/v1/devices/d/readings?"+q.Encode())
			var page struct{ Next string }
			require.NoError(t, jsonUnmarshal(body, &page))
			if page.Next == "" {
				require.Equal(t, 25, pages)
				return
			}
			q = url.Values{"cursor": {page.Next}, "limit": {"10000"}}
		}
	}
	hourURL := env.base + "/v1/devices/d/readings?" + url.Values{"from": {strconv.FormatInt(now.Add(-time.Hour).UnixMilli(), 10)}, "to": {to}, "limit": {"10000"}}.Encode()

	if p := os.Getenv("TELEMETRY_DASHBENCH_PROFILE"); p != "" {
		f, err := os.Create(p)
		require.NoError(t, err)
		require.NoError(t, pprof.StartCPUProfile(f))
		for range 30 {
			httpGet(t, aggURL)
		}
		for range 10 {
			httpGet(t, avgURL)
		}
		httpGet(t, fleetURL)
		pprof.StopCPUProfile()
		require.NoError(t, f.Close())
	}
	for range 3 { // warm up
		httpGet(t, aggURL)
		httpGet(t, avgURL)
	}
	type row struct {
		name   string
		n      int
		ds     []time.Duration
		target time.Duration
	}
	rows := []row{
		{name: "baseline: 1-hour raw range (360 readings)", n: 200, ds: latencies(t, 200, func() { httpGet(t, hourURL) })},
		{name: "baseline: 30 days raw, 26 pages of 10,000", n: 5, ds: latencies(t, 5, rawAll)},
		{name: "aggregates, 1-hour buckets over 30 days (720 buckets)", n: 300, ds: latencies(t, 300, func() { httpGet(t, aggURL) }), target: 10 * time.Millisecond},
		{name: `avg_over_time(temp{device="d"}[1h]), 1 h step, 30 days`, n: 50, ds: latencies(t, 50, func() { httpGet(t, avgURL) }), target: 50 * time.Millisecond},
		{name: "max by (device) (max_over_time(temp[5m])), 1,000 devices, 5 min step, 1 day", n: 5, ds: latencies(t, 5, func() { httpGet(t, fleetURL) }), target: time.Second},
	}
	base := pct(rows[0].ds, 99)
	out := "| query over HTTP | runs | p50 ms | p99 ms | p99 / 1-hour raw range p99 | target | met |\n|---|---|---|---|---|---|---|\n"
	for _, r := range rows {
		target, met := "-", "-"
		if r.target > 0 {
			target = "p99 <= " + ms(r.target) + " ms"
			met = map[bool]string{true: "yes", false: "NO"}[pct(r.ds, 99) <= r.target]
		}
		out += fmt.Sprintf("| %s | %d | %s | %s | %.1f | %s | %s |\n", r.name, r.n, ms(pct(r.ds, 50)), ms(pct(r.ds, 99)),
			float64(pct(r.ds, 99))/float64(base), target, met)
	}
	t.Log("\n" + out)
}
