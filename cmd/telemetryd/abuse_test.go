package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAbuseRealBinary runs telemetryd in a process of its own (this
// test binary running telemetryd's main: runsTelemetryd) with ingest
// running and throws at it far more HTTP connections than its cap (idle
// ones, and slow readers of large ranges, all from one address) and a flood of
// invalid messages, while a well-behaved client on another address
// queries and a device publishes. Every acked reading must be stored,
// the well-behaved client answered, the process alive and within its
// memory budget, and the log bounded. TELEMETRY_LONG=1 runs it with
// 15,000 idle connections (the default run uses 3,000).
//
//	TELEMETRY_LONG=1 go test ./cmd/telemetryd -run TestAbuseRealBinary -v -timeout 20m
func TestAbuseRealBinary(t *testing.T) {
	inLane(t, lanes.general)
	if testing.Short() {
		t.Skip("floods telemetryd in a process of its own")
	}
	idle, slow, readings := 3000, 100, 20000
	if os.Getenv("TELEMETRY_LONG") == "1" {
		idle, slow, readings = 15000, 400, 100000
	}
	dir := t.TempDir()
	bin, err := os.Executable()
	require.NoError(t, err)
	f := newAuthFixture(t, []string{"dev-1"}, "all:read", "metrics:metrics")
	httpAddr, natsAddr := freeLoopback(t), freeLoopback(t)
	logPath := filepath.Join(dir, "telemetryd.log")
	logf, err := os.Create(logPath)
	require.NoError(t, err)
	defer logf.Close()
	// A hard file-descriptor limit of 6,000 (the service raises its soft
	// limit to it): without the connection caps the idle flood alone
	// would take half of it.
	cmd := exec.Command("sh", "-c", `ulimit -n 6000 && exec "$0" "$@"`, bin, "-data-dir", filepath.Join(dir, "data"), "-http-addr", httpAddr, "-nats-listen", natsAddr,
		"-mqtt-listen", "", "-auth-file", f.path, "-http-max-conns", "256", "-http-max-conns-per-client", "64",
		"-http-rate", "200", "-http-burst", "400", "-memory-limit", "1GiB", "-log-level", "info")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), runsTelemetryd+"=1")
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill(); <-exited }()
	base := "http://" + httpAddr

	// The well-behaved client comes from another loopback address.
	good := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
	waitFor(t, 50*time.Millisecond, func() bool {
		resp, err := good.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "service never became ready")

	nc, _, err := deviceConn("nats://"+natsAddr, "dev-1", f.devices["dev-1"])
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	start := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	var acked atomic.Int64
	publish := func(from, n int) {
		for i := from; i < from+n; i += 100 {
			var b strings.Builder
			b.WriteByte('[')
			for j := i; j < i+100 && j < from+n; j++ {
				if j > i {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `{"ts":%d,"temp":%d.5,"note":"reading %d of the abuse test"}`, start.Add(time.Duration(j)*time.Millisecond).UnixMilli(), j%100, j)
			}
			b.WriteByte(']')
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err := js.Publish(ctx, "telemetry.dev-1", []byte(b.String()))
			cancel()
			require.NoError(t, err)
			acked.Add(int64(min(100, from+n-i)))
		}
	}
	publish(0, readings/2)

	// Attack 1: idle connections from 127.0.0.1, far more than the cap.
	var held []net.Conn
	var refused int
	for range idle {
		c, err := net.DialTimeout("tcp", httpAddr, 2*time.Second)
		if err != nil {
			refused++
			continue
		}
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// Attack 2: slow readers of large ranges (never read past a few KiB).
	rangeURL := fmt.Sprintf("/v1/devices/dev-1/readings?from=%d&to=%d&limit=10000", start.UnixMilli(), start.Add(time.Hour).UnixMilli())
	// They come from two other addresses, so they take real slots (the
	// idle flood already holds 127.0.0.1's) and hold real responses.
	var slowConns []net.Conn
	for i := range slow {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(3+i%2))}}
		c, err := d.Dial("tcp", httpAddr)
		if err != nil {
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4096)
		}
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", rangeURL, f.tokens["all"])
		slowConns = append(slowConns, c)
	}
	defer func() {
		for _, c := range slowConns {
			c.Close()
		}
	}()

	// The flood holds no more descriptors than the caps allow.
	fds := func() int {
		entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
		require.NoError(t, err)
		return len(entries)
	}
	time.Sleep(time.Second)
	openFDs := fds()
	t.Logf("service file descriptors under attack: %d", openFDs)
	assert.Less(t, openFDs, 256+1000, "HTTP connections beyond the cap are closed, not held")

	// While attacked: ingest keeps going and the good client is answered.
	var wg sync.WaitGroup
	wg.Go(func() { publish(readings/2, readings/2) })
	var lat []time.Duration
	var failures []string
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		t0 := time.Now()
		code, body := httpDo(t, good, http.MethodGet, base+"/v1/devices/dev-1/readings/latest", f.tokens["all"])
		if code != http.StatusOK {
			failures = append(failures, fmt.Sprintf("%d %s", code, body))
		} else {
			lat = append(lat, time.Since(t0))
		}
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	require.NotEmpty(t, lat)
	t.Logf("idle connections attempted %d (refused at dial %d), slow readers %d; good client: %d answered, %d failed, p50 %s, max %s",
		idle, refused, len(slowConns), len(lat), len(failures), lat[len(lat)/2], lat[len(lat)-1])
	assert.Empty(t, failures, "the well-behaved client is answered")

	// Every acked reading is stored.
	count := func() int {
		n, cursor := 0, ""
		for {
			u := base + rangeURL
			if cursor != "" {
				u += "&cursor=" + cursor
			}
			code, body := httpDo(t, good, http.MethodGet, u, f.tokens["all"])
			if code != http.StatusOK {
				return -1
			}
			var l apiList
			require.NoError(t, json.Unmarshal([]byte(body), &l))
			n += len(l.Readings)
			if l.Next == "" {
				return n
			}
			cursor = l.Next
		}
	}
	waitFor(t, 500*time.Millisecond, func() bool { return count() == int(acked.Load()) },
		"every acked reading (%d) is stored", acked.Load())

	// A flood of invalid messages logs a bounded number of lines: at
	// most the sampler's burst (10) per 10 s interval the flood spans.
	floodStart := time.Now()
	for i := range 5000 {
		require.NoError(t, nc.Publish("telemetry.dev-1", fmt.Appendf(nil, `{"ts":"bad %d","temp":1}`, i)))
	}
	require.NoError(t, nc.Flush())
	waitFor(t, 200*time.Millisecond, func() bool {
		code, body := httpDo(t, good, http.MethodGet, base+"/metrics", f.tokens["metrics"])
		return code == http.StatusOK && strings.Contains(body, `telemetry_ingest_messages_total{`) &&
			strings.Contains(body, `outcome="rejected"`) && rejectedMessages(body) >= 5000
	}, "the invalid messages are dead-lettered")
	floodIntervals := int(time.Since(floodStart)/(10*time.Second)) + 2 // partial intervals at both ends

	// One token past -http-rate gets 429 with Retry-After.
	var limited, retryAfter, burstErrs atomic.Int64
	var statusMu sync.Mutex
	statuses := map[int]int{}
	burst := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 2, MaxConnsPerHost: 2,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.5")}}).DialContext}}
	var rl sync.WaitGroup
	burstStart := time.Now()
	for range 2 {
		rl.Go(func() {
			for range 800 {
				req, _ := http.NewRequest(http.MethodGet, base+"/v1/tables", nil)
				req.Header.Set("Authorization", "Bearer "+f.tokens["all"])
				resp, err := burst.Do(req)
				if err != nil {
					burstErrs.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body) // so the connection is reused
				resp.Body.Close()
				statusMu.Lock()
				statuses[resp.StatusCode]++
				statusMu.Unlock()
				// 429: past the request rate; 503: a new connection past
				// the connection rate. Both say when to come back.
				if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
					limited.Add(1)
					if resp.Header.Get("Retry-After") != "" {
						retryAfter.Add(1)
					}
				}
			}
		})
	}
	rl.Wait()
	// The token's bucket lets through at most its burst and the rate
	// over the time the requests took (and a second of slack for the
	// clocks of client and service): on a slow machine the client may
	// never outrun -http-rate, and then nothing needs refusing.
	burstTime := time.Since(burstStart)
	allowed := 400 + int(200*(burstTime.Seconds()+1))
	t.Logf("rate limit: %d of 1600 requests refused in %s, at most %d allowed (%d failed to connect; statuses %v)",
		limited.Load(), burstTime.Round(time.Millisecond), allowed, burstErrs.Load(), statuses)
	assert.LessOrEqual(t, statuses[http.StatusOK], allowed, "past -http-rate 200 (burst 400) requests get 429")
	if allowed < 1600 {
		assert.Positive(t, statuses[http.StatusTooManyRequests], "past -http-rate 200 (burst 400) requests get 429")
	}
	assert.Equal(t, limited.Load(), retryAfter.Load(), "every refusal has Retry-After")

	hwm := procStatus(t, cmd.Process.Pid, "VmHWM")
	t.Logf("peak RSS %d MiB", hwm>>10)
	assert.Less(t, hwm, int64(1<<20), "peak RSS within the 1 GiB memory budget")
	select {
	case err := <-exited:
		t.Fatalf("telemetryd exited: %v", err)
	default:
	}
	logData, err := os.ReadFile(logPath)
	require.NoError(t, err)
	assert.NotContains(t, string(logData), "panic")
	rejectedLines := strings.Count(string(logData), `msg="message rejected"`)
	t.Logf("log: %d lines in total, %d \"message rejected\" lines for 5000 invalid messages", strings.Count(string(logData), "\n"), rejectedLines)
	assert.LessOrEqual(t, rejectedLines, 10*floodIntervals, "10 lines per 10 s of the flood (%d intervals)", floodIntervals)
	assert.Less(t, strings.Count(string(logData), "\n"), 2000, "the whole log stays bounded")
}

// rejectedMessages sums telemetry_ingest_messages_total{outcome="rejected"}.
func rejectedMessages(metrics string) int {
	n := 0
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "telemetry_ingest_messages_total{") && strings.Contains(line, `outcome="rejected"`) {
			var v float64
			if _, err := fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v); err == nil {
				n += int(v)
			}
		}
	}
	return n
}
