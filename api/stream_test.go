package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// wideReadings adds n readings of dev, one second apart before testNow,
// each with a string value of size bytes.
func wideReadings(t *testing.T, env *testEnv, dev string, n, size int) {
	t.Helper()
	s := strings.Repeat("x", size)
	rs := make([]buckets.Reading, n)
	for i := range rs {
		rs[i] = buckets.Reading{Device: buckets.DeviceID(dev), Ticks: mustTicks(t, testNow.Add(-time.Duration(n-i)*time.Second).Format(time.RFC3339Nano)),
			Values: []buckets.Field{{Name: "s", Value: buckets.String(s)}, {Name: "i", Value: buckets.Int(int64(i))}}}
	}
	env.reader.add(rs...)
}

func rangePath(dev string, limit int) string {
	return "/v1/devices/" + dev + "/readings" + q("from", testNow.Add(-24*time.Hour).Format(time.RFC3339), "to",
		testNow.Format(time.RFC3339), "order", "asc", "limit", fmt.Sprint(limit))
}

// A large page is streamed in chunks (no Content-Length) and is the
// same JSON; a small one keeps its Content-Length.
func TestLargeReadingListIsStreamed(t *testing.T) {
	env := newTestEnv(t)
	wideReadings(t, env, "dev-w", 10000, 100)
	res, err := http.Get(env.url + rangePath("dev-w", 10000))
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, int64(-1), res.ContentLength, "streamed")
	assert.Equal(t, []string{"chunked"}, res.TransferEncoding)
	assert.Equal(t, "application/json", res.Header.Get("Content-Type"))
	var body struct {
		Device   string `json:"device"`
		Readings []struct {
			TS     string         `json:"ts"`
			Values map[string]any `json:"values"`
		} `json:"readings"`
		Next string `json:"next"`
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&body))
	assert.Equal(t, "dev-w", body.Device)
	require.Len(t, body.Readings, 10000)
	for i, r := range body.Readings {
		require.Equal(t, float64(i), r.Values["i"], "reading %d in order", i)
	}
	assert.Empty(t, body.Next)

	small := env.get(t, rangePath("dev-w", 10))
	require.Equal(t, http.StatusOK, small.status)
	assert.NotEmpty(t, small.header.Get("Content-Length"))
	assert.Len(t, small.json(t)["readings"], 10)
	assert.NotEmpty(t, small.json(t)["next"])
}

// Past the budget of response bytes in flight a query is refused at
// once with 503 and Retry-After; when the responses in flight are done,
// queries are answered again.
func TestResponseBudgetRefusesPastIt(t *testing.T) {
	const perPage = 10000 * 256 // what a page of 10,000 readings reserves
	env := newTestEnv(t, func(c *api.Config) { c.ResponseBudget, c.ClientShares = 2*perPage, 1 })
	wideReadings(t, env, "dev-b", 100, 10)
	env.reader.hold(4)

	held := make(chan response, 2)
	for range 2 {
		go func() { held <- env.get(t, rangePath("dev-b", 10000)) }()
	}
	for range 2 {
		select {
		case <-env.reader.entered:
		case <-time.After(5 * time.Second):
			t.Fatal("queries did not reach the reader")
		}
	}
	r := env.get(t, "/v1/devices/dev-b/readings/latest?limit=10")
	requireError(t, r, http.StatusServiceUnavailable, "unavailable", "query responses")
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.Equal(t, int64(1), counterValue(t, env, "telemetry.http.responses.refused"))

	env.reader.mu.Lock()
	close(env.reader.gate)
	env.reader.gate = nil
	env.reader.mu.Unlock()
	for range 2 {
		assert.Equal(t, http.StatusOK, (<-held).status)
	}
	// Each page held 100 readings: the reservations were trimmed and
	// given back.
	assert.Equal(t, http.StatusOK, env.get(t, rangePath("dev-b", 10000)).status)
	assert.Equal(t, http.StatusOK, env.get(t, "/v1/devices/dev-b/readings/latest?limit=1000").status)
}

// A client that stops reading a streamed response is cut off after the
// stall timeout, and what its response held goes back to the budget.
func TestClientThatStopsReadingIsCutOff(t *testing.T) {
	env := newTestEnv(t, func(c *api.Config) {
		c.ResponseBudget = 10000 * 256 // one full page
		c.ClientShares = 1             // one client may take it all
		c.StallTimeout = 300 * time.Millisecond
	})
	wideReadings(t, env, "dev-s", 10000, 4000) // 40 MB of JSON: more than socket buffers hold
	conn := stalledRange(t, env, "dev-s")
	defer conn.Close()

	refused := env.get(t, "/v1/devices/dev-s/readings/latest?limit=1")
	require.Equal(t, http.StatusServiceUnavailable, refused.status, "the stalled response holds the whole budget")
	start := time.Now()
	require.Eventually(t, func() bool {
		return env.get(t, "/v1/devices/dev-s/readings/latest?limit=1").status == http.StatusOK
	}, 10*time.Second, 50*time.Millisecond, "the stalled client was never cut off")
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, int64(1), counterValue(t, env, "telemetry.http.responses.cut_off"))
}

// A client that asks for an ordinary 10,000-reading page of 3-value
// readings (about 1 MiB of JSON, which the kernel's autotuned send
// buffer of a loopback connection would swallow whole) and stops
// reading is cut off too: the server caps each connection's send
// buffer, so the page's writer stalls instead of finishing into kernel
// memory the client never drains.
func TestClientThatStopsReadingAnOrdinaryPageIsCutOff(t *testing.T) {
	env := newTestEnv(t, func(c *api.Config) {
		c.ResponseBudget = 10000 * 256 // one full page
		c.ClientShares = 1             // one client may take it all
		c.StallTimeout = 300 * time.Millisecond
	})
	const n = 10000
	rs := make([]buckets.Reading, n)
	for i := range rs {
		rs[i] = buckets.Reading{Device: "dev-o", Ticks: mustTicks(t, testNow.Add(-time.Duration(n-i)*time.Second).Format(time.RFC3339Nano)),
			Values: []buckets.Field{{Name: "temp", Value: buckets.Float(20 + float64(i%100)/10)},
				{Name: "humidity", Value: buckets.Int(int64(40 + i%30))}, {Name: "door_open", Value: buckets.Bool(i%2 == 0)}}}
	}
	env.reader.add(rs...)
	whole := env.get(t, rangePath("dev-o", n))
	require.Equal(t, http.StatusOK, whole.status)
	require.Less(t, len(whole.body), 2<<20, "an ordinary page, not an oversized one")
	require.Greater(t, len(whole.body), 1<<19, "larger than the capped send buffer")

	require.NoError(t, env.srv.Open()) // the listener the service serves on, not httptest's
	t.Cleanup(func() { _ = env.srv.Close(t.Context()) })
	// The client reads through a small receive window, as a device on
	// a slow link would, so the page must wait in the server's buffers.
	dialer := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	conn, err := dialer.Dial("tcp", env.srv.Addr())
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", rangePath("dev-o", n), env.srv.Addr())
	require.NoError(t, err)
	status, err := bufio.NewReaderSize(conn, 64).ReadString('\n') // the status line, then nothing more
	require.NoError(t, err)
	require.Contains(t, status, "200")

	require.Eventually(t, func() bool {
		return counterValue(t, env, "telemetry.http.responses.cut_off") == 1
	}, 10*time.Second, 50*time.Millisecond, "the client that stopped reading was never cut off")
	// The counter moves as the writer gives up; the reservation goes back
	// when the handler returns, just after.
	assert.Eventually(t, func() bool { return env.get(t, rangePath("dev-o", n)).status == http.StatusOK },
		5*time.Second, 20*time.Millisecond, "its reservation went back to the budget")
}

// Aggregates and PromQL queries take their room in the same budget of
// response bytes in flight: while a stalled response holds all of it,
// both are refused at once with 503 and Retry-After (PromQL in the
// Prometheus shape), and both run again once it is cut off.
func TestBudgetCoversAggregatesAndPromQL(t *testing.T) {
	var promRuns atomic.Int64
	env := newTestEnv(t, func(c *api.Config) {
		c.ResponseBudget = 10000 * 256 // one full page
		c.ClientShares = 1             // one client may take it all
		c.StallTimeout = time.Second
		c.Aggregator = fixedAggregator{}
		c.PromQL = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			promRuns.Add(1)
			_, _ = io.WriteString(w, `{"status":"success","data":{"resultType":"vector","result":[]}}`)
		})
	})
	wideReadings(t, env, "dev-s", 10000, 4000)
	aggPath := "/v1/devices/dev-s/aggregates" + q("from", testNow.Add(-time.Hour).Format(time.RFC3339),
		"to", testNow.Format(time.RFC3339), "interval", "1m")
	require.Equal(t, http.StatusOK, env.get(t, aggPath).status)
	require.Equal(t, http.StatusOK, env.get(t, "/api/v1/query?query=up").status)
	require.Equal(t, int64(1), promRuns.Load())

	conn := stalledRange(t, env, "dev-s") // the page holds the budget
	defer conn.Close()

	agg := env.get(t, aggPath)
	requireError(t, agg, http.StatusServiceUnavailable, "unavailable", "query responses")
	assert.Equal(t, "1", agg.header.Get("Retry-After"))
	prom := env.get(t, "/api/v1/query?query=up")
	require.Equal(t, http.StatusServiceUnavailable, prom.status)
	assert.Equal(t, "1", prom.header.Get("Retry-After"))
	var pe struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
	}
	require.NoError(t, json.Unmarshal(prom.body, &pe))
	assert.Equal(t, []string{"error", "errorType", "status"}, keys(prom.json(t)), "spelled as Prometheus spells it")
	assert.Equal(t, "error", pe.Status)
	assert.Equal(t, "unavailable", pe.ErrorType)
	assert.Contains(t, pe.Error, "memory budget")
	assert.Equal(t, int64(1), promRuns.Load(), "a refused PromQL query never reaches the engine")

	require.Eventually(t, func() bool { return env.get(t, aggPath).status == http.StatusOK },
		10*time.Second, 50*time.Millisecond, "the stalled client was never cut off")
	require.Equal(t, http.StatusOK, env.get(t, "/api/v1/query?query=up").status)
	assert.Equal(t, int64(2), promRuns.Load())
}

// The engine's sample limit keeps promQueriesAtOnce queries of 16-byte
// samples within the budget.
func TestPromQLMaxSamplesFollowsTheBudget(t *testing.T) {
	assert.Equal(t, 800_000, api.PromQLMaxSamples(8*800_000*16))
	assert.Equal(t, api.PromQLMaxSamples(api.DefaultResponseBudget), api.PromQLMaxSamples(0))
}

// counterValue sums an int64 counter's data points.
func counterValue(t *testing.T, env *testEnv, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, env.metrics.Collect(context.Background(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				n += dp.Value
			}
		}
	}
	return n
}

// stalledRange asks for a 10,000-reading page of dev over a raw
// connection and reads only the status line (200), so the rest of the
// answer stalls in the server; the caller closes the connection.
func stalledRange(t *testing.T, env *testEnv, dev string) net.Conn {
	t.Helper()
	u, err := url.Parse(env.url)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", rangePath(dev, 10000), u.Host)
	require.NoError(t, err)
	status, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, status, "200")
	return conn
}
