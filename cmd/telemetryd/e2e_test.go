package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// testEpoch is the fixed instant the service clock starts at in tests,
// so day boundaries and the retention window do not depend on the date
// the tests run on.
var testEpoch = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// testService is one in-process telemetryd on random ports.
type testService struct {
	*Main
	cfg  Config
	base string // http://127.0.0.1:port
	nc   *nats.Conn
	js   jetstream.JetStream
}

// newTestConfig returns a config on a fresh data dir and random ports.
func newTestConfig(t testing.TB) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.NATSListen = "127.0.0.1:-1"
	cfg.MQTTListen = "127.0.0.1:-1"
	cfg.RetentionInterval = time.Hour
	cfg.LogLevel = "warn"
	// No request rate limit: tests that are not about it must pass
	// however fast (or slow) the machine runs them.
	cfg.Security.HTTPRate = 0
	return cfg
}

// testClock runs from testEpoch at the speed of the real clock.
func testClock() func() time.Time {
	start := time.Now()
	return func() time.Time { return testEpoch.Add(time.Since(start)) }
}

// openMain opens a service for cfg logging to w, on the clock now (nil:
// the real clock), and closes it at cleanup.
func openMain(t testing.TB, cfg Config, w io.Writer, now func() time.Time) *Main {
	t.Helper()
	m := NewMain(cfg, newLogger(cfg, w), func(string) string { return "" })
	if now != nil {
		m.now = now
	}
	ctx, cancel := untilDeadline(t)
	defer cancel()
	err := m.Open(ctx)
	if err != nil {
		_ = m.Close(context.Background())
	}
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, m.Close(ctx))
	})
	return m
}

// startService opens a service for cfg and closes it at cleanup.
func startService(t testing.TB, cfg Config, opts ...func(*Main)) *testService {
	t.Helper()
	m := NewMain(cfg, newLogger(cfg, testLogWriter(t)), func(string) string { return "" })
	m.now = testClock()
	for _, o := range opts {
		o(m)
	}
	ctx, cancel := untilDeadline(t)
	defer cancel()
	err := m.Open(ctx)
	if err != nil {
		_ = m.Close(context.Background())
	}
	require.NoError(t, err)
	s := &testService{Main: m, cfg: cfg, base: "http://" + m.HTTPAddr()}
	t.Cleanup(func() { s.stop(t) })
	nc, err := nats.Connect(m.NATSURL())
	require.NoError(t, err)
	s.nc = nc
	s.js, err = jetstream.New(nc)
	require.NoError(t, err)
	s.waitReady(t)
	return s
}

// stop closes the client connection and the service (idempotent).
func (s *testService) stop(t testing.TB) {
	t.Helper()
	if s.nc != nil {
		s.nc.Close()
	}
	ctx, cancel := untilDeadline(t)
	defer cancel()
	require.NoError(t, s.Close(ctx))
}

func (s *testService) waitReady(t testing.TB) {
	t.Helper()
	waitFor(t, 20*time.Millisecond, func() bool {
		code, _ := s.get(t, "/readyz", nil)
		return code == http.StatusOK
	}, "service never became ready")
}

// publish sends payload for device and waits for the JetStream ack.
func (s *testService) publish(t *testing.T, device, payload string) {
	t.Helper()
	ctx, cancel := untilDeadline(t)
	defer cancel()
	_, err := s.js.Publish(ctx, s.cfg.SubjectPrefix+"."+device, []byte(payload))
	require.NoError(t, err)
}

// publishEach sends each payload for device as a message of its own
// and waits for every JetStream ack. The messages are in flight
// together, as a busy device's are, so the service stores and acks
// them in batches, where publish in a loop waits for a commit (and,
// synced, an fsync) per message.
func (s *testService) publishEach(t *testing.T, device string, payloads []string) {
	t.Helper()
	acks := make([]jetstream.PubAckFuture, 0, len(payloads))
	for _, p := range payloads {
		a, err := s.js.PublishAsync(s.cfg.SubjectPrefix+"."+device, []byte(p))
		require.NoError(t, err)
		acks = append(acks, a)
	}
	ctx, cancel := untilDeadline(t)
	defer cancel()
	for i, a := range acks {
		select {
		case <-a.Ok():
		case err := <-a.Err():
			require.NoError(t, err, "message %d of %s", i, device)
		case <-ctx.Done():
			require.Fail(t, "no ack", "message %d of %s", i, device)
		}
	}
}

// get fetches path and decodes JSON into out (when not nil).
func (s *testService) get(t testing.TB, path string, out any) (int, string) {
	t.Helper()
	resp, err := http.Get(s.base + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil && resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(body, out), "body %s", body)
	}
	return resp.StatusCode, string(body)
}

// apiReading and apiList mirror the JSON of api/README.md.
type apiReading struct {
	TS           string         `json:"ts"`
	PartitionKey string         `json:"partitionKey"`
	RowKey       string         `json:"rowKey"`
	Values       map[string]any `json:"values"`
}

type apiList struct {
	Device   string       `json:"device"`
	Readings []apiReading `json:"readings"`
	Next     string       `json:"next"`
}

// fixture is a reading the test published.
type fixture struct {
	device string
	at     time.Time
	temp   float64
}

func (f fixture) payload() string {
	return fmt.Sprintf(`{"ts":%q,"values":{"temp":%v,"seq":%d}}`, f.at.Format(time.RFC3339Nano), f.temp, f.at.UnixMilli())
}

// threeDays returns readings for devices over the test day and the
// two before it, including both edges of each day.
func threeDays(devices []string) []fixture {
	today := testEpoch.Truncate(24 * time.Hour)
	var fs []fixture
	for di, dev := range devices {
		for d := -2; d <= 0; d++ {
			day := today.AddDate(0, 0, d)
			offsets := []time.Duration{0, time.Second, 3 * time.Hour, 11*time.Hour + 59*time.Minute}
			if d < 0 {
				offsets = append(offsets, 23*time.Hour, 24*time.Hour-time.Millisecond)
			}
			for i, off := range offsets {
				fs = append(fs, fixture{device: dev, at: day.Add(off), temp: float64(di*100+(d+2)*10+i) + 0.5})
			}
		}
	}
	return fs
}

func publishAll(t *testing.T, s *testService, fs []fixture) {
	t.Helper()
	for _, f := range fs {
		s.publish(t, f.device, f.payload())
	}
}

// waitStored waits until device has n readings in the last 3 days.
func waitStored(t *testing.T, s *testService, device string, n int) {
	t.Helper()
	waitFor(t, 20*time.Millisecond, func() bool {
		return len(pageAll(t, s, device, "asc", 1000, url.Values{})) == n
	}, "device %s never reached %d readings", device, n)
}

// pageAll follows next cursors of a range query and returns every
// reading in the order the pages gave them.
func pageAll(t *testing.T, s *testService, device, order string, limit int, q url.Values) []apiReading {
	t.Helper()
	if q.Get("from") == "" {
		q.Set("from", testEpoch.AddDate(0, 0, -3).Format(time.RFC3339))
	}
	q.Set("order", order)
	q.Set("limit", fmt.Sprint(limit))
	var all []apiReading
	for page := 0; ; page++ {
		require.Less(t, page, 10000, "cursor never ended")
		var l apiList
		code, body := s.get(t, "/v1/devices/"+device+"/readings?"+q.Encode(), &l)
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, device, l.Device)
		require.LessOrEqual(t, len(l.Readings), limit)
		all = append(all, l.Readings...)
		if l.Next == "" {
			return all
		}
		q.Set("cursor", l.Next)
	}
}

func expectedOrder(fs []fixture, device string, desc bool) []string {
	var ts []string
	for _, f := range fs {
		if f.device == device {
			ts = append(ts, f.at.UTC().Format(time.RFC3339Nano))
		}
	}
	slices.SortFunc(ts, func(a, b string) int {
		ta, _ := time.Parse(time.RFC3339Nano, a)
		tb, _ := time.Parse(time.RFC3339Nano, b)
		if desc {
			return tb.Compare(ta)
		}
		return ta.Compare(tb)
	})
	return ts
}

func timestamps(rs []apiReading) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.TS
	}
	return out
}

func TestEndToEnd(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	devices := []string{"dev-1", "dev-2", "boiler_7"}
	fs := threeDays(devices)
	publishAll(t, s, fs)
	perDevice := len(fs) / len(devices)
	for _, d := range devices {
		waitStored(t, s, d, perDevice)
	}

	t.Run("latest newest first with values", func(t *testing.T) {
		var l apiList
		code, body := s.get(t, "/v1/devices/dev-2/readings/latest?limit=5", &l)
		require.Equal(t, http.StatusOK, code, body)
		want := expectedOrder(fs, "dev-2", true)[:5]
		assert.Equal(t, want, timestamps(l.Readings))
		// dev-2 is device index 1: the newest is today's 11:59 reading (offset index 3).
		assert.Equal(t, 100+20+3+0.5, l.Readings[0].Values["temp"])
		assert.Empty(t, l.Next)
	})

	for _, order := range []string{"desc", "asc"} {
		t.Run("range "+order+" pages across days exactly once", func(t *testing.T) {
			for _, limit := range []int{1, 4, 7, 1000} {
				got := timestamps(pageAll(t, s, "dev-1", order, limit, url.Values{}))
				assert.Equal(t, expectedOrder(fs, "dev-1", order == "desc"), got, "limit %d", limit)
			}
		})
	}

	t.Run("from inclusive to exclusive", func(t *testing.T) {
		want := expectedOrder(fs, "dev-1", false)
		q := url.Values{"from": {want[2]}, "to": {want[8]}}
		got := timestamps(pageAll(t, s, "dev-1", "asc", 3, q))
		assert.Equal(t, want[2:8], got)
	})

	t.Run("point query", func(t *testing.T) {
		f := fs[4]
		var r apiReading
		code, body := s.get(t, "/v1/devices/"+f.device+"/readings/"+f.at.Format(time.RFC3339Nano), &r)
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, f.temp, r.Values["temp"])
		code, body = s.get(t, "/v1/devices/"+f.device+"/readings/"+f.at.Add(time.Millisecond).Format(time.RFC3339Nano), nil)
		assert.Equal(t, http.StatusNotFound, code)
		assert.Contains(t, body, `"not_found"`)
	})

	t.Run("fields projection", func(t *testing.T) {
		var l apiList
		code, body := s.get(t, "/v1/devices/dev-1/readings/latest?limit=3&fields=seq", &l)
		require.Equal(t, http.StatusOK, code, body)
		require.Len(t, l.Readings, 3)
		for _, r := range l.Readings {
			assert.Equal(t, []string{"seq"}, slices.Collect(mapsKeys(r.Values)))
		}
	})
}

func mapsKeys(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestContractKeys(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	s.publish(t, "dev-1", `{"ts":"2026-11-22T01:02:03.456Z","temp":21.5,"ok":true}`)
	var r apiReading
	waitFor(t, 20*time.Millisecond, func() bool {
		code, _ := s.get(t, "/v1/devices/dev-1/readings/1795309323456", &r)
		return code == http.StatusOK
	})
	assert.Equal(t, "2026-11-22T01:02:03.456Z", r.TS)
	assert.Equal(t, "dev-1/2026-11-22", r.PartitionKey)
	assert.Equal(t, "2516069914765439999", r.RowKey)
	assert.Equal(t, map[string]any{"temp": 21.5, "ok": true}, r.Values)
}

func TestRangeCursorWhileIngesting(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	fs := threeDays([]string{"dev-1"})
	publishAll(t, s, fs)
	waitStored(t, s, "dev-1", len(fs))

	// Keep publishing new readings inside the queried window while paging.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		yesterday := testEpoch.Truncate(24*time.Hour).AddDate(0, 0, -1)
		for i := 0; ctx.Err() == nil && i < 500; i++ {
			f := fixture{device: "dev-1", at: yesterday.Add(time.Duration(i+1) * time.Minute), temp: float64(i)}
			_, _ = s.js.Publish(ctx, "telemetry.dev-1", []byte(f.payload()))
		}
	})
	for _, order := range []string{"desc", "asc"} {
		got := timestamps(pageAll(t, s, "dev-1", order, 2, url.Values{}))
		seen := map[string]int{}
		for _, ts := range got {
			seen[ts]++
		}
		for ts, n := range seen {
			assert.Equal(t, 1, n, "%s returned %d times in %s order", ts, n, order)
		}
		for _, ts := range expectedOrder(fs, "dev-1", false) {
			assert.Equal(t, 1, seen[ts], "%s missing in %s order", ts, order)
		}
		assert.True(t, slices.IsSortedFunc(got, func(a, b string) int {
			ta, _ := time.Parse(time.RFC3339Nano, a)
			tb, _ := time.Parse(time.RFC3339Nano, b)
			if order == "desc" {
				return tb.Compare(ta)
			}
			return ta.Compare(tb)
		}), "pages out of %s order", order)
	}
	cancel()
	wg.Wait()
}

func TestMergeAndRedelivery(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	ts := testEpoch.Add(-time.Hour).Format(time.RFC3339Nano)
	// Two sensors of one device sampled at the same instant, sent apart.
	s.publish(t, "dev-9", fmt.Sprintf(`{"ts":%q,"temp":20.5,"rh":40}`, ts))
	s.publish(t, "dev-9", fmt.Sprintf(`{"ts":%q,"temp":21.5,"co2":400}`, ts))
	want := map[string]any{"temp": 21.5, "rh": float64(40), "co2": float64(400)}
	var r apiReading
	waitFor(t, 20*time.Millisecond, func() bool {
		code, _ := s.get(t, "/v1/devices/dev-9/readings/"+ts, &r)
		return code == http.StatusOK && len(r.Values) == 3
	})
	assert.Equal(t, want, r.Values)

	// The same message again (a redelivery) leaves the same reading.
	s.publish(t, "dev-9", fmt.Sprintf(`{"ts":%q,"temp":21.5,"co2":400}`, ts))
	s.publish(t, "dev-9", fmt.Sprintf(`{"ts":%q,"temp":0,"marker":1}`, testEpoch.Add(-30*time.Minute).Format(time.RFC3339Nano)))
	waitStored(t, s, "dev-9", 2)
	code, _ := s.get(t, "/v1/devices/dev-9/readings/"+ts, &r)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, want, r.Values)
}

func TestRejectedMessageGoesToDeadLetterAndIngestContinues(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	sub, err := s.nc.SubscribeSync("rejected.telemetry.>")
	require.NoError(t, err)
	good := testEpoch.Add(-time.Minute).Format(time.RFC3339Nano)
	bad := fmt.Sprintf(`[{"ts":%q,"temp":1},{"ts":%q,"temp":"x","nested":{"a":1}}]`, good, good)
	s.publish(t, "dev-5", bad)
	msg, err := sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "rejected.telemetry.dev-5", msg.Subject)
	assert.Equal(t, bad, string(msg.Data))
	assert.Equal(t, string(buckets.CodeInvalidValue), msg.Header.Get("Telemetry-Error-Code"))
	assert.Contains(t, msg.Header.Get("Telemetry-Error"), "reading 1")
	assert.Contains(t, msg.Header.Get("Telemetry-Error"), "nested")

	s.publish(t, "dev-5", fmt.Sprintf(`{"ts":%q,"temp":2}`, good))
	waitStored(t, s, "dev-5", 1)
	var l apiList
	s.get(t, "/v1/devices/dev-5/readings/latest", &l)
	require.Len(t, l.Readings, 1)
	assert.Equal(t, float64(2), l.Readings[0].Values["temp"], "nothing of the rejected batch may be stored")
}

func TestRestartKeepsEveryReading(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	s := startService(t, cfg)
	fs := threeDays([]string{"dev-1", "dev-2"})
	publishAll(t, s, fs)
	waitStored(t, s, "dev-1", len(fs)/2)
	waitStored(t, s, "dev-2", len(fs)/2)
	s.stop(t)

	s2 := startService(t, cfg)
	for _, d := range []string{"dev-1", "dev-2"} {
		got := timestamps(pageAll(t, s2, d, "desc", 1000, url.Values{}))
		assert.Equal(t, expectedOrder(fs, d, true), got, d)
	}
	var devs struct {
		Devices []map[string]any `json:"devices"`
	}
	code, body := s2.get(t, "/v1/devices", &devs)
	require.Equal(t, http.StatusOK, code, body)
	assert.Len(t, devs.Devices, 2)
}

// testLogWriter sends service logs to the test log.
func testLogWriter(t testing.TB) io.Writer {
	if os.Getenv("TELEMETRY_TEST_LOGS") != "" {
		return os.Stderr
	}
	return tWriter{t}
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestBadHTTPInputThroughTheService(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	long := strings.Repeat("a", 65)
	for _, tc := range []struct{ path, param string }{
		{"/v1/devices/..%2Fetc/readings/latest", "device"},
		{"/v1/devices/a.b/readings/latest", "device"},
		{"/v1/devices/" + long + "/readings/latest", "device"},
		{"/v1/devices/dev-1/readings/latest?limit=0", "limit"},
		{"/v1/devices/dev-1/readings/latest?limit=1001", "limit"},
		{"/v1/devices/dev-1/readings?limit=10001", "limit"},
		{"/v1/devices/dev-1/readings?from=abc", "from"},
		{"/v1/devices/dev-1/readings?to=yesterday", "to"},
		{"/v1/devices/dev-1/readings?order=sideways", "order"},
		{"/v1/devices/dev-1/readings?cursor=Zm9yZ2Vk", "cursor"},
		{"/v1/devices/dev-1/readings/not-a-time", "ts"},
		{"/v1/devices/dev-1/readings/latest?fields=a,,b", "fields"},
	} {
		code, body := s.get(t, tc.path, nil)
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", tc.path, body)
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &e), body)
		assert.Equal(t, "invalid_argument", e.Error.Code, tc.path)
		assert.True(t, strings.HasPrefix(e.Error.Message, tc.param), "%s: message %q names %s", tc.path, e.Error.Message, tc.param)
	}
	// A cursor from one device's query is refused on another's.
	fs := threeDays([]string{"dev-1"})
	publishAll(t, s, fs)
	waitStored(t, s, "dev-1", len(fs))
	var l apiList
	q := url.Values{"from": {testEpoch.AddDate(0, 0, -3).Format(time.RFC3339)}, "limit": {"2"}}
	code, _ := s.get(t, "/v1/devices/dev-1/readings?"+q.Encode(), &l)
	require.Equal(t, http.StatusOK, code)
	require.NotEmpty(t, l.Next)
	q.Set("cursor", l.Next)
	code, body := s.get(t, "/v1/devices/dev-2/readings?"+q.Encode(), nil)
	assert.Equal(t, http.StatusBadRequest, code, body)
	assert.Contains(t, body, `"message":"cursor`)
}

// streamOf is the readings stream that keeps dev's messages on a single
// node with the default streams per partition.
func streamOf(dev string) string {
	return partition.Stream("TELEMETRY", partition.Of(DefaultStreamPartitions, dev))
}

// storedSubject is the subject dev's messages are stored under there.
func storedSubject(dev string) string {
	return "telemetry." + strconv.Itoa(partition.Of(DefaultStreamPartitions, dev)) + "." + dev
}
