package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/buckets/bucketstest"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
)

// testJetStream is an in-process NATS server with JetStream and the
// TELEMETRY stream the service creates (ingest/README.md).
type testJetStream struct {
	url    string
	stream jetstream.Stream
}

func newTestJetStream(t *testing.T) *testJetStream {
	t.Helper()
	srv := ingesttest.RunNATS(t)

	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "TELEMETRY", Subjects: []string{"telemetry.*"}, Storage: jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
	})
	require.NoError(t, err)
	return &testJetStream{url: srv.ClientURL(), stream: stream}
}

// messages returns every message in the stream, in order.
func (tj *testJetStream) messages(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := tj.stream.Info(ctx)
	require.NoError(t, err)
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := tj.stream.GetMsg(ctx, seq)
		require.NoError(t, err)
		out = append(out, m)
	}
	require.Len(t, out, int(info.State.Msgs))
	return out
}

// count returns the number of messages in the stream.
func (tj *testJetStream) count(t *testing.T) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := tj.stream.Info(ctx)
	require.NoError(t, err)
	return info.State.Msgs
}

// testConfig is -count 500 -rate 0 -batch 10 over 5 devices, quiet.
func testConfig(url string) config {
	cfg := defaultConfig()
	cfg.NATSURL = url
	cfg.Devices, cfg.Count, cfg.Rate, cfg.Batch = 5, 500, 0, 10
	cfg.Duration, cfg.Progress, cfg.Seed = 0, 0, 7
	return cfg
}

func runSim(t *testing.T, cfg config, deps runDeps) summary {
	t.Helper()
	if deps.Logger == nil {
		deps.Logger = discardLogger()
	}
	require.NoError(t, cfg.validate())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sum, err := run(ctx, cfg, deps)
	require.NoError(t, err)
	return sum
}

func TestRunPublishesEveryReadingOnce(t *testing.T) {
	tj := newTestJetStream(t)
	cfg := testConfig(tj.url)

	sum := runSim(t, cfg, runDeps{})
	assert.Equal(t, summary{Stopped: stopCount, Messages: 50, Published: 500, Acked: 500, Elapsed: sum.Elapsed}, sum)
	assert.Positive(t, sum.Rate())

	msgs := tj.messages(t)
	require.Len(t, msgs, 50)
	readings := 0
	perSubject := map[string]int{}
	for _, m := range msgs {
		rs := decodePayload(t, m.Data, true)
		assert.Len(t, rs, 10, "readings in %s", m.Subject)
		readings += len(rs)
		perSubject[m.Subject]++
		assert.Equal(t, "", m.Header.Get("traceparent"), "traceparent without -trace")
		dev := strings.TrimPrefix(m.Subject, "telemetry.")
		assert.Equal(t, fmt.Sprintf("%s-%d", dev, perSubject[m.Subject]), m.Header.Get(jetstream.MsgIDHeader))
	}
	assert.Equal(t, 500, readings)
	assert.Equal(t, map[string]int{
		"telemetry.sim-0001": 10, "telemetry.sim-0002": 10, "telemetry.sim-0003": 10,
		"telemetry.sim-0004": 10, "telemetry.sim-0005": 10,
	}, perSubject)

	t.Run("re-run is deduplicated by Nats-Msg-Id", func(t *testing.T) {
		again := runSim(t, cfg, runDeps{})
		assert.Equal(t, summary{Stopped: stopCount, Messages: 50, Published: 500, Acked: 500, Duplicates: 500,
			Elapsed: again.Elapsed}, again)
		assert.Len(t, tj.messages(t), 50, "the re-run added messages")
	})
	t.Run("seq-start continues the sequence", func(t *testing.T) {
		next := cfg
		next.SeqStart = 11
		sum := runSim(t, next, runDeps{})
		assert.Equal(t, int64(0), sum.Duplicates)
		assert.Len(t, tj.messages(t), 100)
	})
	t.Run("without msg-id a re-run adds messages", func(t *testing.T) {
		noID := cfg
		noID.MsgID = false
		sum := runSim(t, noID, runDeps{})
		assert.Equal(t, int64(0), sum.Duplicates)
		msgs := tj.messages(t)
		require.Len(t, msgs, 150)
		assert.Equal(t, "", msgs[149].Header.Get(jetstream.MsgIDHeader))
	})
}

func TestRunFormats(t *testing.T) {
	tj := newTestJetStream(t)
	tests := []struct {
		format, ts string
		batch      int
		wantTS     *regexp.Regexp
	}{
		{"nested", "rfc3339", 1, regexp.MustCompile(`^\{"ts":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(\d{3})?Z","values":\{`)},
		{"flat", "epoch-ms", 1, regexp.MustCompile(`^\{"ts":\d{13},"temp":`)},
		{"flat", "rfc3339", 3, regexp.MustCompile(`^\[\{"ts":"[^"]+Z","temp":`)},
	}
	for i, tt := range tests {
		t.Run(fmt.Sprintf("%s %s batch %d", tt.format, tt.ts, tt.batch), func(t *testing.T) {
			cfg := testConfig(tj.url)
			cfg.Format, cfg.TSFormat, cfg.Batch, cfg.Count, cfg.Values = tt.format, tt.ts, tt.batch, 6, 4
			cfg.DevicePrefix = fmt.Sprintf("fmt%d-", i)
			sum := runSim(t, cfg, runDeps{})
			require.Equal(t, int64(6), sum.Acked)
			for _, m := range tj.messages(t) {
				if !strings.HasPrefix(m.Subject, "telemetry."+cfg.DevicePrefix) {
					continue
				}
				assert.Regexp(t, tt.wantTS, string(m.Data))
				for _, r := range decodePayload(t, m.Data, tt.format == "nested") {
					assert.Equal(t, []string{"battery", "humidity", "sensor_4", "temp"}, sortedKeys(r.values))
					assert.WithinDuration(t, time.Now(), r.ticks.Time(), time.Minute)
				}
			}
		})
	}
}

var traceparentRE = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`)

func TestRunTraceInjectsPublishSpan(t *testing.T) {
	tj := newTestJetStream(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg := testConfig(tj.url)
	cfg.Trace, cfg.Count = true, 40

	sum := runSim(t, cfg, runDeps{TracerProvider: tp})
	require.Equal(t, int64(40), sum.Acked)

	spans := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.SpanContext().SpanID()] = s
	}
	msgs := tj.messages(t)
	require.Len(t, msgs, 4)
	for _, m := range msgs {
		tp := m.Header.Get("traceparent")
		require.Regexp(t, traceparentRE, tp)
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), headerCarrier(m.Header)))
		require.True(t, sc.IsValid())
		span, ok := spans[sc.SpanID()]
		require.True(t, ok, "traceparent %s names no ended span", tp)
		assert.Equal(t, "publish "+m.Subject, span.Name())
		assert.Equal(t, trace.SpanKindProducer, span.SpanKind())
		assert.Contains(t, span.Attributes(), attribute.Int("messaging.batch.message_count", 10))
	}
}

// Main with -trace and the URL from the environment: exit code 0, a
// summary line, and a traceparent on every message.
func TestMainTraceFromEnv(t *testing.T) {
	tj := newTestJetStream(t)
	var logs bucketstest.SyncBuffer
	env := envOf(map[string]string{"TELEMETRY_SIM_NATS_URL": tj.url, "TELEMETRY_SIM_LOG_FORMAT": "json"})
	code := Main(context.Background(), []string{"-count", "20", "-rate", "0", "-batch", "5", "-devices", "2", "-trace"}, env, &logs)
	require.Equal(t, 0, code, "logs:\n%s", logs.String())

	msgs := tj.messages(t)
	require.Len(t, msgs, 4)
	for _, m := range msgs {
		assert.Regexp(t, traceparentRE, m.Header.Get("traceparent"))
	}
	done := lastLogLine(t, logs.String(), "done")
	assert.Equal(t, "count", done["stopped"])
	assert.EqualValues(t, 20, done["acked"])
	assert.EqualValues(t, 0, done["errors"])
	assert.Contains(t, done, "elapsed")
	assert.Contains(t, done, "rate")
}

func TestRunHonorsRate(t *testing.T) {
	tj := newTestJetStream(t)
	cfg := testConfig(tj.url)
	cfg.Rate, cfg.Batch, cfg.Count = 2000, 1, 400
	sum := runSim(t, cfg, runDeps{})
	require.Equal(t, int64(400), sum.Acked)
	assert.GreaterOrEqual(t, sum.Elapsed, 190*time.Millisecond, "400 readings at 2000/s")
	assert.Less(t, sum.Elapsed, 3*time.Second)
	assert.LessOrEqual(t, sum.Rate(), 2000*1.05)
}

func TestRunStopsAfterDuration(t *testing.T) {
	tj := newTestJetStream(t)
	cfg := testConfig(tj.url)
	cfg.Rate, cfg.Count, cfg.Duration, cfg.Progress = 100, 0, 300*time.Millisecond, 50*time.Millisecond
	var logs bucketstest.SyncBuffer
	sum := runSim(t, cfg, runDeps{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	assert.Equal(t, stopDuration, sum.Stopped)
	assert.InDelta(t, 30, sum.Published, 12, "readings in 300ms at 100/s")
	assert.Equal(t, sum.Published, sum.Acked)
	assert.Zero(t, sum.Errors+sum.Unacked)
	assert.Less(t, sum.Elapsed, 2*time.Second)

	progress := lastLogLine(t, logs.String(), "progress")
	for _, k := range []string{"published", "acked", "errors", "publish_rate", "ack_rate", "pending"} {
		assert.Contains(t, progress, k)
	}
}

func TestRunStopsOnCancelAndWaitsForAcks(t *testing.T) {
	tj := newTestJetStream(t)
	cfg := testConfig(tj.url)
	cfg.Count, cfg.MaxPending = 0, 64
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	sum, err := run(ctx, cfg, runDeps{Logger: discardLogger()})
	require.NoError(t, err)
	assert.Equal(t, stopSignal, sum.Stopped)
	assert.Positive(t, sum.Published)
	assert.Equal(t, sum.Published, sum.Acked, "outstanding acks were not awaited")
	assert.Zero(t, sum.Errors+sum.Unacked)
	assert.Equal(t, uint64(sum.Messages), tj.count(t))
}

func TestRunWindowOfOne(t *testing.T) {
	tj := newTestJetStream(t)
	cfg := testConfig(tj.url)
	cfg.MaxPending, cfg.Batch, cfg.Count = 1, 1, 25
	sum := runSim(t, cfg, runDeps{})
	assert.Equal(t, int64(25), sum.Acked)
	assert.Len(t, tj.messages(t), 25)
}

func TestRunCountsReadingsNoStreamAccepts(t *testing.T) {
	tj := newTestJetStream(t)
	var logs bucketstest.SyncBuffer
	code := Main(context.Background(), []string{"-nats-url", tj.url, "-subject-prefix", "nostream", "-count", "3",
		"-rate", "0", "-devices", "1", "-progress", "0"}, envOf(nil), &logs)
	assert.Equal(t, 1, code, "exit code when readings were not acked")
	assert.Contains(t, logs.String(), "publish failed")
	assert.Contains(t, logs.String(), "errors=3")
	assert.Empty(t, tj.messages(t))
}

func TestRunRejectsMessagesOverMaxPayload(t *testing.T) {
	tj := newTestJetStream(t)
	cfg := testConfig(tj.url)
	cfg.Batch, cfg.Values, cfg.Count = 2000, 100, 4000
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sum, err := run(ctx, cfg, runDeps{Logger: discardLogger()})
	require.ErrorIs(t, err, nats.ErrMaxPayload)
	assert.Contains(t, err.Error(), "-batch")
	assert.Equal(t, stopFatalError, sum.Stopped)
	assert.Equal(t, int64(2000), sum.Errors, "stopped after the first oversized message")
}

func TestMainBadFlags(t *testing.T) {
	var out bytes.Buffer
	assert.Equal(t, 2, Main(context.Background(), []string{"-batch", "10001"}, envOf(nil), &out))
	assert.Contains(t, out.String(), "-batch 10001")
	assert.Equal(t, 0, Main(context.Background(), []string{"-help"}, envOf(nil), &out))
}

func TestMainCannotConnect(t *testing.T) {
	var out bytes.Buffer
	code := Main(context.Background(), []string{"-nats-url", "nats://127.0.0.1:1", "-count", "1"}, envOf(nil), &out)
	assert.Equal(t, 1, code)
	assert.Contains(t, out.String(), "connect to nats://127.0.0.1:1")
}

// lastLogLine returns the last JSON log record whose msg is msg.
func lastLogLine(t *testing.T, logs, msg string) map[string]any {
	t.Helper()
	var found map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			found = rec
		}
	}
	require.NotNil(t, found, "no %q line in logs:\n%s", msg, logs)
	return found
}

// With -trace and an OTLP endpoint in the environment, the publish
// spans reach the collector over OTLP/HTTP when the simulator exits.
func TestMainExportsSpansOverOTLP(t *testing.T) {
	tj := newTestJetStream(t)
	var mu sync.Mutex
	var posts []string
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		posts = append(posts, fmt.Sprintf("%s %s %s %d", r.Method, r.URL.Path, r.Header.Get("Content-Type"), len(body)))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")

	var logs bucketstest.SyncBuffer
	code := Main(context.Background(), []string{"-nats-url", tj.url, "-count", "10", "-rate", "0", "-trace", "-progress", "0"},
		os.Getenv, &logs)
	require.Equal(t, 0, code, "logs:\n%s", logs.String())
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, posts, "no spans exported")
	assert.Regexp(t, `^POST /v1/traces application/x-protobuf [1-9]\d*$`, posts[0])
}
