package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/telemetryd/telemetryd/cmd/internal/otelsetup"
)

func TestTraceContextFromPublisherToStoreCommit(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	s := startService(t, newTestConfig(t), func(m *Main) {
		m.telOpts.SpanProcessors = []sdktrace.SpanProcessor{sdktrace.NewSimpleSpanProcessor(exp)}
	})
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	msg := nats.NewMsg("telemetry.dev-tr")
	msg.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	msg.Data = []byte(fmt.Sprintf(`{"ts":%d,"temp":1}`, testEpoch.Add(-time.Minute).UnixMilli()))
	_, err := s.js.PublishMsg(context.Background(), msg)
	require.NoError(t, err)

	var batch, commit tracetest.SpanStub
	waitFor(t, 20*time.Millisecond, func() bool {
		batch, commit = tracetest.SpanStub{}, tracetest.SpanStub{}
		for _, sp := range exp.GetSpans() {
			if sp.Name == "ingest.batch" && slices.ContainsFunc(sp.Links, func(l sdktrace.Link) bool { return l.SpanContext.TraceID() == traceID }) {
				batch = sp
			}
		}
		for _, sp := range exp.GetSpans() {
			if sp.Name == "store.commit" && batch.Name != "" && sp.Parent.SpanID() == batch.SpanContext.SpanID() {
				commit = sp
			}
		}
		return commit.Name != ""
	}, "no ingest.batch span linked to the publisher's trace with a store.commit child")
	assert.Equal(t, batch.SpanContext.TraceID(), commit.SpanContext.TraceID())

	// An HTTP request is a server span too.
	s.get(t, "/v1/devices/dev-tr/readings/latest", nil)
	waitFor(t, 20*time.Millisecond, func() bool {
		return slices.ContainsFunc(exp.GetSpans(), func(sp tracetest.SpanStub) bool {
			return sp.SpanKind == trace.SpanKindServer && strings.Contains(sp.Name, "/v1/devices/{device}/readings/latest")
		})
	})
}

// scrape parses the service's /metrics.
func scrape(t *testing.T, s *testService) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(s.base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return mfs
}

// sample returns the value of the counter or histogram count in family
// name whose labels include want.
func sample(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func TestMetricsCountReadingsByOutcomeAndCode(t *testing.T) {
	s := startService(t, newTestConfig(t))
	at := func(d time.Duration) int64 { return testEpoch.Add(d).UnixMilli() }
	s.publish(t, "dev-m", fmt.Sprintf(`{"ts":%d,"a":1}`, at(-time.Minute)))
	s.publish(t, "dev-m", fmt.Sprintf(`[{"ts":%d,"a":1},{"ts":%d,"a":2},{"ts":%d,"a":3}]`, at(-2*time.Minute), at(-3*time.Minute), at(-4*time.Minute)))
	s.publish(t, "dev-m", fmt.Sprintf(`[{"ts":%d,"a":1},{"ts":%d,"a":null}]`, at(-5*time.Minute), at(-6*time.Minute)))
	s.publish(t, "dev-m", fmt.Sprintf(`{"ts":%d,"a":1}`, at(-800*time.Hour)))
	s.publish(t, "dev-m", fmt.Sprintf(`{"ts":%d,"a":1}`, at(time.Hour)))
	s.publish(t, "dev-m", `not json`)
	waitStored(t, s, "dev-m", 4)

	want := []struct {
		labels map[string]string
		n      float64
	}{
		{map[string]string{"outcome": "accepted"}, 4},
		{map[string]string{"outcome": "rejected", "code": "invalid_value"}, 2},
		{map[string]string{"outcome": "rejected", "code": "too_old"}, 1},
		{map[string]string{"outcome": "rejected", "code": "too_far_in_future"}, 1},
		{map[string]string{"outcome": "rejected", "code": "invalid_payload"}, 1},
	}
	var mfs map[string]*dto.MetricFamily
	waitFor(t, 50*time.Millisecond, func() bool {
		mfs = scrape(t, s)
		for _, w := range want {
			if got, _ := sample(mfs, "telemetry_ingest_readings_total", w.labels); got != w.n {
				return false
			}
		}
		acked, _ := sample(mfs, "telemetry_ingest_messages_total", map[string]string{"outcome": "acked"})
		return acked == 2
	})
	for _, w := range want {
		got, ok := sample(mfs, "telemetry_ingest_readings_total", w.labels)
		assert.True(t, ok, "%v", w.labels)
		assert.Equal(t, w.n, got, "%v", w.labels)
	}
	acked, _ := sample(mfs, "telemetry_ingest_messages_total", map[string]string{"outcome": "acked"})
	rejected, _ := sample(mfs, "telemetry_ingest_messages_total", map[string]string{"outcome": "rejected"})
	assert.Equal(t, 2.0, acked)
	assert.Equal(t, 4.0, rejected)

	batches, ok := sample(mfs, "telemetry_ingest_batch_size", nil)
	assert.True(t, ok, "batch size histogram present")
	assert.GreaterOrEqual(t, batches, 1.0)
	lag := mfs["telemetry_ingest_lag_seconds"]
	require.NotNil(t, lag, "lag histogram present")
	h := lag.GetMetric()[0].GetHistogram()
	assert.Equal(t, uint64(4), h.GetSampleCount(), "one lag sample per accepted reading")
	// The test clock runs at testEpoch; readings were 1-4 minutes old.
	assert.InDelta(t, (60+120+180+240)/4.0, h.GetSampleSum()/4, 30, "mean lag in seconds")

	s.get(t, "/v1/devices/dev-m/readings/latest", nil)
	mfs = scrape(t, s)
	n, ok := sample(mfs, "http_server_request_duration_seconds", map[string]string{
		"http_route": "/v1/devices/{device}/readings/latest", "http_request_method": "GET", "http_response_status_code": "200"})
	assert.True(t, ok, "http duration histogram by route")
	assert.GreaterOrEqual(t, n, 1.0)
	for _, name := range []string{"telemetry_store_commit_duration_seconds", "telemetry_store_tables", "telemetry_store_bytes"} {
		assert.Contains(t, mfs, name)
	}
}

// otlpReceiver is a minimal OTLP/HTTP trace endpoint.
type otlpReceiver struct {
	mu    sync.Mutex
	names []string
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil || req.URL.Path != "/v1/traces" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	var ex coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &ex); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range ex.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.names = append(r.names, sp.GetName())
			}
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func TestOTLPExportOverHTTP(t *testing.T) {
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	t.Setenv("OTEL_SERVICE_NAME", "telemetryd-test")

	cfg := newTestConfig(t)
	m := NewMain(cfg, newLogger(cfg, testLogWriter(t)), os.Getenv)
	m.now = testClock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, m.Open(ctx))
	resp, err := http.Get("http://" + m.HTTPAddr() + "/v1/tables")
	require.NoError(t, err)
	resp.Body.Close()
	require.NoError(t, m.Close(ctx), "close flushes the exporter")

	recv.mu.Lock()
	defer recv.mu.Unlock()
	assert.Contains(t, recv.names, "GET /v1/tables")
	assert.Contains(t, recv.names, "retention.run", "the start-up retention run is traced")
}

func TestTelemetryDisabled(t *testing.T) {
	tel, err := otelsetup.New(context.Background(), envMap(map[string]string{"OTEL_SDK_DISABLED": "true"}), otelsetup.Options{})
	require.NoError(t, err)
	_, span := tel.Tracer.Tracer("t").Start(context.Background(), "x")
	assert.False(t, span.SpanContext().IsValid(), "no spans when disabled")
	c, err := tel.Meter.Meter("t").Int64Counter("telemetry.test")
	require.NoError(t, err)
	c.Add(context.Background(), 1)
	rec := httptest.NewRecorder()
	tel.Metrics.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	assert.NotContains(t, rec.Body.String(), "telemetry_test")
	assert.Contains(t, rec.Body.String(), "go_goroutines", "runtime metrics stay")
	require.NoError(t, tel.Shutdown(context.Background()))
}

func TestLogsCarryTraceAndSpanIDs(t *testing.T) {
	var buf strings.Builder
	cfg := DefaultConfig()
	cfg.LogFormat = "json"
	log := newLogger(cfg, &buf)
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "op")
	log.InfoContext(ctx, "inside")
	span.End()
	log.InfoContext(context.Background(), "outside")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2)
	assert.Contains(t, lines[0], `"trace_id":"`+span.SpanContext().TraceID().String()+`"`)
	assert.Contains(t, lines[0], `"span_id":"`+span.SpanContext().SpanID().String()+`"`)
	assert.NotContains(t, lines[1], "trace_id")
}
