package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/cmd/internal/cliflag"
)

// envInt reads an integer environment override.
func envInt(t *testing.T, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, name)
		return n
	}
	return def
}

// TestQueriesWithinMemoryLimit: 30 day tables of 1,000,000 readings
// (100 devices, so a device has 10,000 readings a day), telemetryd as
// its own process with -memory-limit (1GiB, TELEMETRY_QUERYLOAD_LIMIT),
// and 200 concurrent clients asking for 10,000-reading ranges over
// every day: half read their answers (and honour 503 Retry-After),
// half read the status line and stop reading. Peak RSS stays within the
// limit, every well-behaved client is answered, the slow ones are cut
// off. Slow; it only runs with TELEMETRY_QUERYLOAD=1:
//
//	TELEMETRY_QUERYLOAD=1 go test ./cmd/telemetryd -run TestQueriesWithinMemoryLimit -v -timeout 60m
func TestQueriesWithinMemoryLimit(t *testing.T) {
	if os.Getenv("TELEMETRY_QUERYLOAD") != "1" {
		t.Skip("set TELEMETRY_QUERYLOAD=1 to run the query load measurement")
	}
	days := envInt(t, "TELEMETRY_QUERYLOAD_DAYS", 30)
	perDay := envInt(t, "TELEMETRY_QUERYLOAD_PER_DAY", 1_000_000)
	clients := envInt(t, "TELEMETRY_QUERYLOAD_CLIENTS", 200)
	seconds := envInt(t, "TELEMETRY_QUERYLOAD_SECONDS", 60)
	limit := os.Getenv("TELEMETRY_QUERYLOAD_LIMIT")
	if limit == "" {
		limit = "1GiB"
	}
	var limitBytes int64
	require.NoError(t, cliflag.Size(&limitBytes).Set(limit))
	const devices = 100
	// TELEMETRY_QUERYLOAD_DIR keeps the filled data dir there for the
	// next run (filled again only when it has no tables yet).
	dir := os.Getenv("TELEMETRY_QUERYLOAD_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	today := buckets.DayOfTime(time.Now())
	first := today - buckets.Day(days) + 1
	if _, err := os.Stat(filepath.Join(dir, "data", "tables", today.String())); err != nil {
		filled := time.Now()
		fillStore(t, filepath.Join(dir, "data"), first, today, perDay, devices)
		t.Logf("filled %d days x %d readings in %v", days, perDay, time.Since(filled).Round(time.Second))
	}

	bin := filepath.Join(dir, "telemetryd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	httpAddr, natsAddr := freeLoopback(t), freeLoopback(t)
	cmd := exec.Command(bin, "-data-dir", filepath.Join(dir, "data"), "-http-addr", httpAddr, "-nats-listen", natsAddr,
		"-mqtt-listen", "", "-log-level", "warn", "-memory-limit", limit,
		"-http-rate", "0", "-http-max-conns", "1024", "-http-max-conns-per-client", "1024")
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	base := "http://" + httpAddr
	waitReadyz(t, base)
	t.Logf("after start: RSS %d MiB", procStatus(t, cmd.Process.Pid, "VmRSS")>>10)

	path := func(i int) string {
		d := first + buckets.Day(i%days)
		q := url.Values{"from": {d.Start().FormatTime()}, "to": {d.End().FormatTime()}, "limit": {"10000"}}
		return fmt.Sprintf("/v1/devices/dev-%04d/readings?%s", (i/days)%devices, q.Encode())
	}
	// Slow clients take a small receive window, so that a response does
	// not vanish into kernel buffers and the server has to wait on them.
	slowDialer := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	var answered, refused, readings, cut, slowTries, slowAnswered atomic.Int64
	perClient := make([]int64, clients/2)
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	for c := range clients / 2 {
		wg.Go(func() { // reads its answers; honours Retry-After
			for i := c; time.Now().Before(deadline); i += clients / 2 {
				resp, err := client.Get(base + path(i))
				if !assert.NoError(t, err) {
					return
				}
				// 429: past this address's share; 503: past the budget.
				if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests {
					refused.Add(1)
					ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					time.Sleep(time.Duration(max(ra, 1)) * time.Second)
					continue
				}
				var page struct {
					Readings []json.RawMessage `json:"readings"`
				}
				err = json.NewDecoder(resp.Body).Decode(&page)
				resp.Body.Close()
				if !assert.NoError(t, err) || !assert.Equal(t, http.StatusOK, resp.StatusCode) {
					return
				}
				assert.Len(t, page.Readings, min(10000, perDay/devices))
				answered.Add(1)
				readings.Add(int64(len(page.Readings)))
				perClient[c]++
			}
		})
		wg.Go(func() { // asks, reads the status line, stops reading
			for i := c; time.Now().Before(deadline); i += clients / 2 {
				conn, err := slowDialer.Dial("tcp", httpAddr)
				if !assert.NoError(t, err) {
					return
				}
				slowTries.Add(1)
				fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path(i), httpAddr)
				status, err := bufio.NewReaderSize(conn, 64).ReadString('\n')
				if err == nil && len(status) > 12 && (status[9:12] == "503" || status[9:12] == "429") {
					conn.Close()
					time.Sleep(time.Second)
					continue
				}
				if err == nil && len(status) > 12 && status[9:12] == "200" {
					slowAnswered.Add(1)
				}
				// Stop reading for longer than the server's stall timeout
				// (10s); the server cuts the response off meanwhile
				// (telemetry_http_responses_cut_off_total).
				time.Sleep(15 * time.Second)
				cut.Add(1)
				conn.Close()
			}
		})
	}
	peakDuring := int64(0)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for loop := true; loop; {
		select {
		case <-done:
			loop = false
		case <-time.After(time.Second):
			peakDuring = max(peakDuring, procStatus(t, cmd.Process.Pid, "VmHWM"))
		}
	}
	peak := procStatus(t, cmd.Process.Pid, "VmHWM")
	t.Logf("%d clients for %ds: %d answers (%d readings), %d refused with 503, %d slow requests (%d left unread); peak RSS (VmHWM) %d MiB, limit %s; RSS now %d MiB",
		clients, seconds, answered.Load(), readings.Load(), refused.Load(), slowTries.Load(), cut.Load(), peak>>10, limit,
		procStatus(t, cmd.Process.Pid, "VmRSS")>>10)
	unanswered := 0
	for _, n := range perClient {
		if n == 0 {
			unanswered++
		}
	}
	t.Logf("well-behaved clients never answered: %d of %d", unanswered, len(perClient))
	assert.Zero(t, unanswered, "every well-behaved client is answered")
	assert.LessOrEqual(t, peak, limitBytes>>10, "VmHWM in KiB")
	metrics, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(metrics.Body)
	metrics.Body.Close()
	counters := map[string]float64{}
	for _, l := range strings.Split(string(body), "\n") {
		for _, name := range []string{"telemetry_http_responses_cut_off_total", "telemetry_http_responses_refused_total"} {
			if rest, ok := strings.CutPrefix(l, name); ok && len(rest) > 0 && (rest[0] == ' ' || rest[0] == '{') {
				t.Log(l)
				v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
				require.NoError(t, err, l)
				counters[name] += v
			}
		}
	}
	// Every slow client that got its 200 stopped reading for longer
	// than the stall timeout: the server cut each of them off (a page
	// of 10,000 readings is larger than a connection's send buffer).
	t.Logf("slow requests answered 200: %d; responses cut off: %.0f", slowAnswered.Load(), counters["telemetry_http_responses_cut_off_total"])
	assert.Positive(t, slowAnswered.Load(), "some slow clients got a response to abandon")
	if perDay/devices < 10000 {
		return // smaller pages may fit a send buffer whole
	}
	assert.GreaterOrEqual(t, counters["telemetry_http_responses_cut_off_total"], float64(slowAnswered.Load()),
		"every abandoned response was cut off")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
}
