package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets/bucketstest"
	"github.com/telemetryd/telemetryd/ingest"
)

// withLogs sends the service's log to buf at cfg's level.
func withLogs(buf *bucketstest.SyncBuffer) func(*Main) {
	return func(m *Main) { m.log = newLogger(m.cfg, buf) }
}

// logLines splits a text log into lines with their level and message.
type logLine struct{ level, msg, raw string }

var logFields = regexp.MustCompile(`level=(\w+) msg=("(?:[^"\\]|\\.)*"|\S+)`)

func logLines(s string) []logLine {
	var out []logLine
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		m := logFields.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		msg := m[2]
		if u, err := strconv.Unquote(msg); err == nil {
			msg = u
		}
		out = append(out, logLine{level: m[1], msg: msg, raw: l})
	}
	return out
}

// metricValue reads the value of the first sample of name whose labels
// contain labels (e.g. `reason="manual"`); ok false when absent.
func metricValue(body, name, labels string) (float64, bool) {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		if strings.Contains(m[1], labels) {
			v, err := strconv.ParseFloat(m[2], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// TestStartupLogsOneLinePerConcern: at info level the start-up log is
// one line each for the memory budget, the store, auth, the listeners
// and the consumer; the budget's parts are at debug.
func TestStartupLogsOneLinePerConcern(t *testing.T) {
	var buf bucketstest.SyncBuffer
	cfg := newTestConfig(t)
	cfg.LogLevel = "info"
	s := startService(t, cfg, withLogs(&buf))
	count := map[string]int{}
	var started logLine
	waitFor(t, 10*time.Millisecond, func() bool { return strings.Contains(buf.String(), "msg=consuming") })
	for _, l := range logLines(buf.String()) {
		assert.NotEqual(t, "ERROR", l.level, l.raw)
		assert.NotEqual(t, "WARN", l.level, l.raw)
		key := l.msg
		if strings.HasPrefix(key, "auth ") {
			key = "auth"
		}
		count[key]++
		if key == "telemetryd started" {
			started = l
		}
	}
	assert.Equal(t, map[string]int{"memory budget": 1, "store open": 1, "auth": 1, "telemetryd started": 1, "consuming": 1}, count,
		"%s", buf.String())
	for _, k := range []string{"http_addr=" + s.Main.api.Addr(), "nats_url=nats://", "mqtt_addr=" + s.Main.MQTTAddr(), "data_dir="} {
		assert.Contains(t, started.raw, k)
	}
	assert.Contains(t, buf.String(), "auth off: any client that reaches a listener may read, write and publish as any device (add -auth-file FILE)")
	for _, k := range []string{"memory_limit=", "go_soft_limit=", "memtables=", "block_caches=", "index_caches=", "jetstream_memory=",
		"consumer_buffers=", "query_responses="} {
		assert.Contains(t, buf.String(), k)
	}
}

// TestDocumentedCountersAtZeroFromStart: every counter in the README's
// metrics table is in /metrics from the start, at 0, so rate() and
// alerts see the series before the first event.
func TestDocumentedCountersAtZeroFromStart(t *testing.T) {
	readme := docFile(t, "cmd/telemetryd/OPERATIONS.md")
	row := regexp.MustCompile("^\\| `(telemetry_[a-z_]+)(?:\\{[^}]*\\})?` \\| counter \\|")
	var counters []string
	sc := bufio.NewScanner(strings.NewReader(readme))
	for sc.Scan() {
		if m := row.FindStringSubmatch(sc.Text()); m != nil {
			counters = append(counters, m[1])
		}
	}
	require.GreaterOrEqual(t, len(counters), 6, "OPERATIONS.md's metrics table lists the counters")

	s := startService(t, newTestConfig(t))
	resp, err := http.Get(s.base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = bufioCopy(&b, resp)
	body := b.String()
	for _, c := range counters {
		v, ok := metricValue(body, c, "")
		if assert.True(t, ok, "%s is in /metrics from the start", c) {
			assert.Zero(t, v, c)
		}
	}
	for _, reason := range []string{"expired", "size_limit", "manual"} {
		_, ok := metricValue(body, "telemetry_retention_tables_dropped_total", `reason="`+reason+`"`)
		assert.True(t, ok, "tables dropped, reason %s", reason)
	}
}

func bufioCopy(b *strings.Builder, resp *http.Response) (int64, error) {
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var n int64
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
		n += int64(len(sc.Text()) + 1)
	}
	return n, sc.Err()
}

// TestManualDropIsCounted: DELETE /v1/tables/{day} counts the table and
// its bytes in the retention counters under reason "manual".
func TestManualDropIsCounted(t *testing.T) {
	s := startService(t, newTestConfig(t))
	fillDays(t, s, "dev-m", []int{2}, 50)
	waitStored(t, s, "dev-m", 50)
	day := testEpoch.Truncate(24*time.Hour).AddDate(0, 0, -2).Format("2006-01-02")
	code, body := s.do(t, http.MethodDelete, "/v1/tables/"+day)
	require.Equal(t, http.StatusOK, code, body)
	code, metrics := s.do(t, http.MethodGet, "/metrics")
	require.Equal(t, http.StatusOK, code)
	v, ok := metricValue(metrics, "telemetry_retention_tables_dropped_total", `reason="manual"`)
	require.True(t, ok)
	assert.Equal(t, 1.0, v)
	freed, ok := metricValue(metrics, "telemetry_retention_bytes_freed_total", `reason="manual"`)
	require.True(t, ok)
	assert.Positive(t, freed)
}

// TestClientMistakesLoggedOnceAsWarnings: a refused NATS login is one
// WARN line (not the server's ERROR lines as well), an MQTT 5 client
// is one WARN line that says which version the listener speaks, a
// refused MQTT login adds no line of the server's, and none is an
// ERROR.
func TestClientMistakesLoggedOnceAsWarnings(t *testing.T) {
	var buf bucketstest.SyncBuffer
	f := newAuthFixture(t, []string{"dev-1"}, "reader:read")
	cfg := newTestConfig(t)
	cfg.LogLevel = "info"
	cfg.Security.AuthFile = f.path
	s := NewMain(cfg, newLogger(cfg, &buf), func(string) string { return "" })
	require.NoError(t, s.Open(t.Context()))
	t.Cleanup(func() { assert.NoError(t, s.Close(context.Background())) })

	_, err := nats.Connect(s.NATSURL(), nats.UserInfo("dev-1", "wrong-secret"), nats.NoReconnect())
	require.Error(t, err)
	// mqttConnect sends one CONNECT and returns the CONNACK.
	mqttConnect := func(body string) []byte {
		t.Helper()
		conn, err := net.Dial("tcp", s.MQTTAddr())
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write(append([]byte{0x10, byte(len(body))}, body...))
		require.NoError(t, err)
		ack := make([]byte, 4)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Second)))
		_, err = io.ReadFull(conn, ack)
		require.NoError(t, err)
		return ack
	}
	// MQTT 5 (protocol level 5, clean start, no properties).
	assert.Equal(t, []byte{0x20, 0x02, 0x00, 0x01}, mqttConnect("\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x03cid"),
		"CONNACK: unacceptable protocol version")
	// MQTT 3.1.1 with a wrong password: refused (and, within the
	// sampling interval of the first refusal, counted, not logged).
	assert.Equal(t, []byte{0x20, 0x02, 0x00, 0x05}, mqttConnect("\x00\x04MQTT\x04\xc2\x00\x3c\x00\x03cid\x00\x05dev-1\x00\x05wrong"),
		"CONNACK: not authorized")

	waitFor(t, 10*time.Millisecond, func() bool {
		return strings.Contains(buf.String(), "login refused") && strings.Contains(buf.String(), "MQTT 3.1.1")
	}, "%s", &buf)
	var refused, mqtt5 int
	for _, l := range logLines(buf.String()) {
		assert.NotEqual(t, "ERROR", l.level, l.raw)
		assert.NotContains(t, l.raw, "authentication error", "the refusal is logged by the service, once")
		if strings.Contains(l.msg, "login refused") {
			refused++
			assert.Equal(t, "WARN", l.level)
			assert.Contains(t, l.raw, "user=dev-1")
		}
		if strings.Contains(l.msg, "unacceptable protocol version") {
			mqtt5++
			assert.Equal(t, "WARN", l.level)
		}
	}
	assert.Equal(t, 1, refused)
	assert.Equal(t, 1, mqtt5)
}

// TestDurabilityModeIsReported: /readyz and the start-up line say which
// durability mode runs and what an ack promises, and the mode is the
// one the embedded JetStream runs (fsync of every write or not).
func TestDurabilityModeIsReported(t *testing.T) {
	for _, tc := range []struct {
		sync bool
		mode string
		ack  string
	}{
		{false, ingest.DurabilityBuffered, "sync to disk every 1s (-sync-interval)"},
		{true, ingest.DurabilitySynced, "survives a power cut"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			var buf bucketstest.SyncBuffer
			cfg := newTestConfig(t)
			cfg.LogLevel = "info"
			cfg.SyncWrites = tc.sync
			s := startService(t, cfg, withLogs(&buf))
			var ready struct {
				Status, Durability, Ack string
				Streams                 []string
			}
			code, body := s.get(t, "/readyz", &ready)
			require.Equal(t, http.StatusOK, code, body)
			assert.Equal(t, "ready", ready.Status)
			assert.Equal(t, tc.mode, ready.Durability, body)
			assert.Contains(t, ready.Ack, tc.ack)
			assert.Equal(t, []string{"TELEMETRY_0", "TELEMETRY_1", "TELEMETRY_2", "TELEMETRY_3", "TELEMETRY_4", "TELEMETRY_5", "TELEMETRY_6", "TELEMETRY_7"},
				ready.Streams, "a stream per partition")
			assert.Equal(t, tc.sync, s.Main.nats.NATS().JetStreamConfig().SyncAlways, "the embedded JetStream's fsync of every write")
			// Its timer restarts only after a sync, so it runs at half of
			// -sync-interval to keep an fsync within the interval.
			assert.Equal(t, cfg.SyncInterval/2, s.Main.nats.NATS().JetStreamConfig().SyncInterval, "the embedded JetStream syncs at half of -sync-interval")

			var started string
			for _, l := range logLines(buf.String()) {
				if l.msg == "telemetryd started" {
					started = l.raw
				}
			}
			assert.Contains(t, started, "durability="+tc.mode)
			assert.Contains(t, started, tc.ack)
		})
	}
}
