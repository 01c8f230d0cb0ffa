package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// BenchmarkExport measures GET /v1/export against the range API on the
// same readings in the same run: a service (the default -memory-limit,
// 1 GiB) on a data dir filled straight through store.Write with
// TELEMETRY_EXPORT_READINGS readings (default 1,000,000) over 100
// devices in two days, three values each. It reports the readings per
// second of an NDJSON and a CSV export and of paging the range API over
// every device (pages of 10,000), each read whole by one client and
// thrown away, and the process's peak RSS during each (VmHWM, reset
// before each by /proc/self/clear_refs).
//
//	TELEMETRY_EXPORT_READINGS=10000000 go test ./cmd/telemetryd -run '^$' -bench BenchmarkExport -benchtime 1x -timeout 30m
func BenchmarkExport(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("TELEMETRY_EXPORT_READINGS"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(b, err)
	}
	const devices = 100
	cfg := newTestConfig(b)
	last := buckets.DayOf(buckets.MustTicks(testEpoch)) - 1
	t0 := time.Now()
	fillStore(b, cfg.DataDir, last-1, last, n/2, devices)
	b.Logf("filled %d readings in %s", n, time.Since(t0).Round(time.Millisecond))
	s := startService(b, cfg)
	to := strconv.FormatInt(testEpoch.UnixMilli(), 10)
	client := &http.Client{}

	measure := func(name string, f func() (int, error)) {
		runtime.GC()
		debug.FreeOSMemory()
		require.NoError(b, os.WriteFile("/proc/self/clear_refs", []byte("5"), 0))
		t0 := time.Now()
		got, err := f()
		d := time.Since(t0)
		require.NoError(b, err)
		require.Equal(b, n, got, name)
		hwm := peakRSS(b)
		b.ReportMetric(float64(got)/d.Seconds(), name+"-readings/s")
		b.ReportMetric(float64(hwm>>20), name+"-peak-rss-MiB")
		b.Logf("%s: %d readings in %s, %.0f readings/s, peak RSS %d MiB (limit %d MiB)",
			name, got, d.Round(time.Millisecond), float64(got)/d.Seconds(), hwm>>20, cfg.MemoryLimit>>20)
	}
	get := func(u string, count func([]byte) int) (int, string, error) {
		res, err := client.Get(u)
		if err != nil {
			return 0, "", err
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(res.Body)
			return 0, "", fmt.Errorf("%s: %s", res.Status, body)
		}
		buf := make([]byte, 256<<10)
		got := 0
		var tail []byte
		for {
			m, err := res.Body.Read(buf)
			got += count(buf[:m])
			if m > 0 {
				tail = append(tail[:0], buf[max(0, m-512):m]...)
			}
			if err == io.EOF {
				return got, string(tail), nil
			}
			if err != nil {
				return got, "", err
			}
		}
	}
	lines := func(b []byte) int { return bytes.Count(b, []byte{'\n'}) }
	b.ResetTimer()
	for b.Loop() {
		measure("range", func() (int, error) {
			total := 0
			for d := range devices {
				cursor := ""
				for {
					u := s.base + "/v1/devices/" + fmt.Sprintf("dev-%04d", d) + "/readings?" + url.Values{
						"from": {"0"}, "to": {to}, "order": {"asc"}, "limit": {"10000"}, "cursor": {cursor}}.Encode()
					var page struct {
						Next string `json:"next"`
					}
					got, tail, err := get(u, func(b []byte) int { return bytes.Count(b, []byte(`"rowKey"`)) })
					if err != nil {
						return total, err
					}
					total += got
					if i := strings.LastIndex(tail, `,"next":`); i >= 0 {
						if err := json.Unmarshal([]byte("{"+tail[i+1:]), &page); err != nil {
							return total, err
						}
					}
					if page.Next == "" {
						break
					}
					cursor = page.Next
				}
			}
			return total, nil
		})
		measure("export-ndjson", func() (int, error) {
			got, _, err := get(s.base+"/v1/export?to="+to, lines)
			return got, err
		})
		measure("export-csv", func() (int, error) {
			got, _, err := get(s.base+"/v1/export?format=csv&to="+to, lines)
			return (got - 1) / 3, err
		})
	}
	b.StopTimer()
}

// peakRSS reads VmHWM of this process.
func peakRSS(b *testing.B) int64 {
	raw, err := os.ReadFile("/proc/self/status")
	require.NoError(b, err)
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(b, err)
			return kb << 10
		}
	}
	b.Fatal("no VmHWM in /proc/self/status")
	return 0
}
