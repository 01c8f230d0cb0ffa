package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// TestServiceMemoryThirtyDays measures the real service's peak RSS
// with a month of data: 30 day tables of 100,000 readings each (1,000
// devices, 3 values), then telemetryd started as its own process and
// queried on every day. It is slow and only runs with
// TELEMETRY_MEMTEST=1:
//
//	TELEMETRY_MEMTEST=1 go test ./cmd/telemetryd -run TestServiceMemoryThirtyDays -v -timeout 30m
func TestServiceMemoryThirtyDays(t *testing.T) {
	if os.Getenv("TELEMETRY_MEMTEST") != "1" {
		t.Skip("set TELEMETRY_MEMTEST=1 to run the memory measurement")
	}
	const days, perDay, devices = 30, 100_000, 1000
	dir := t.TempDir()
	today := buckets.DayOfTime(time.Now())
	fillStore(t, filepath.Join(dir, "data"), today-days+1, today, perDay, devices)

	bin := filepath.Join(dir, "telemetryd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	httpAddr, natsAddr := freeLoopback(t), freeLoopback(t)
	cmd := exec.Command(bin, "-data-dir", filepath.Join(dir, "data"), "-http-addr", httpAddr, "-nats-listen", natsAddr, "-mqtt-listen", "", "-log-level", "warn")
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	base := "http://" + httpAddr
	waitReadyz(t, base)
	t.Logf("after start: RSS %d MiB", procStatus(t, cmd.Process.Pid, "VmRSS")>>10)

	start := time.Now()
	for d := today - days + 1; d <= today; d++ {
		for _, dev := range []string{"dev-0000", "dev-0500", "dev-0999"} {
			q := url.Values{"from": {d.Start().FormatTime()}, "to": {d.End().FormatTime()}, "limit": {"10000"}}
			resp, err := http.Get(base + "/v1/devices/" + dev + "/readings?" + q.Encode())
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
		}
	}
	for _, p := range []string{"/v1/tables", "/v1/devices?limit=1000", "/v1/devices/dev-0001/readings/latest?limit=1000"} {
		resp, err := http.Get(base + p)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, p)
	}
	peak := procStatus(t, cmd.Process.Pid, "VmHWM")
	t.Logf("queried %d days in %v: peak RSS %d MiB, RSS now %d MiB", days, time.Since(start).Round(time.Millisecond),
		peak>>10, procStatus(t, cmd.Process.Pid, "VmRSS")>>10)
	assert.Less(t, peak, int64(1<<20), "peak RSS must stay under 1 GiB (value in KiB)")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait())
}

// fillStore writes perDay readings of devices for every day in
// [first, last] straight into a store under dir.
func fillStore(t testing.TB, dir string, first, last buckets.Day, perDay, devices int) {
	t.Helper()
	opts := store.DefaultOptions()
	s, err := store.Open(context.Background(), dir, opts)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	step := buckets.TicksPerDay / buckets.Ticks(perDay/devices)
	batch := make([]buckets.Reading, 0, 10_000)
	for d := first; d <= last; d++ {
		for i := 0; i < perDay; i++ {
			dev := buckets.DeviceID(fmt.Sprintf("dev-%04d", i%devices))
			batch = append(batch, buckets.Reading{Device: dev, Ticks: d.Start() + buckets.Ticks(i/devices)*step,
				Values: []buckets.Field{
					{Name: "battery", Value: buckets.Float(3.7 - float64(i%100)/1000)},
					{Name: "humidity", Value: buckets.Float(40 + float64(i%50)/10)},
					{Name: "temp", Value: buckets.Float(20 + float64(i%70)/10)},
				}})
			if len(batch) == cap(batch) {
				require.NoError(t, s.Write(context.Background(), batch))
				batch = batch[:0]
			}
		}
	}
	require.NoError(t, s.Write(context.Background(), batch))
}

// waitReadyz polls base's /readyz until it answers 200 (waitFor).
func waitReadyz(t *testing.T, base string) {
	t.Helper()
	waitFor(t, 50*time.Millisecond, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "%s/readyz never answered 200", base)
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// procStatus reads a "kB" field of /proc/<pid>/status, in KiB.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			var kb int64
			_, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb)
			require.NoError(t, err)
			return kb
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
