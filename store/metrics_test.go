package store

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/telemetryd/telemetryd/buckets"
)

// collect reads every metric of the reader by name.
func collectMetrics(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

func gaugeValue(t *testing.T, m map[string]metricdata.Aggregation, name string) int64 {
	t.Helper()
	g, ok := m[name].(metricdata.Gauge[int64])
	require.True(t, ok, "%s is an int64 gauge", name)
	require.Len(t, g.DataPoints, 1)
	return g.DataPoints[0].Value
}

func counterValue(m map[string]metricdata.Aggregation, name string) int64 {
	s, ok := m[name].(metricdata.Sum[int64])
	if !ok || len(s.DataPoints) == 0 {
		return 0
	}
	return s.DataPoints[0].Value
}

func TestMetricsAndCommitSpan(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	ts := newTestStore(t, func(o *Options) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		o.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	})
	ctx, parent := sdktrace.NewTracerProvider().Tracer("test").Start(context.Background(), "batch")
	rs := append(series("dev", dayTick(today-3, time.Hour), time.Second, 10), series("dev", dayTick(today, time.Hour), time.Second, 5)...)
	require.NoError(t, ts.Write(ctx, rs))
	parent.End()

	m := collectMetrics(t, reader)
	h, ok := m["telemetry.store.commit.duration"].(metricdata.Histogram[float64])
	require.True(t, ok)
	require.Len(t, h.DataPoints, 1)
	assert.Equal(t, uint64(1), h.DataPoints[0].Count, "one observation per Write")
	assert.Equal(t, int64(2), gaugeValue(t, m, "telemetry.store.tables"))
	assert.Equal(t, int64(2), gaugeValue(t, m, "telemetry.store.open_tables"))
	tables, err := ts.Tables(context.Background())
	require.NoError(t, err)
	assert.Equal(t, tables[0].SizeBytes+tables[1].SizeBytes, gaugeValue(t, m, "telemetry.store.bytes"))

	ended := spans.Ended()
	require.Len(t, ended, 1)
	sp := ended[0]
	assert.Equal(t, "store.commit", sp.Name())
	assert.Equal(t, parent.SpanContext().TraceID(), sp.Parent().TraceID(), "child of the caller's span")
	assert.Equal(t, parent.SpanContext().SpanID(), sp.Parent().SpanID())
	assert.Contains(t, sp.Attributes(), attribute.Int("telemetry.store.readings", 15))
	assert.Contains(t, sp.Attributes(), attribute.Int("telemetry.store.tables", 2))

	_, err = ts.DropTable(context.Background(), today-3)
	require.NoError(t, err)
	m = collectMetrics(t, reader)
	assert.Equal(t, int64(1), gaugeValue(t, m, "telemetry.store.tables"))
	assert.Equal(t, int64(1), gaugeValue(t, m, "telemetry.store.open_tables"))
	assert.Equal(t, tables[1].SizeBytes, gaugeValue(t, m, "telemetry.store.bytes"))
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestDamagedTableIsLoggedOnceAndCounted(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	bad := today - 2
	ts.write(t, reading("dev", dayTick(bad, time.Hour), "v", 1), reading("dev", dayTick(today, time.Hour), "v", 2))
	require.NoError(t, ts.Close())
	require.NoError(t, os.Truncate(filepath.Join(ts.dir, "tables", bad.String(), "MANIFEST"), 1))

	reader := sdkmetric.NewManualReader()
	var logs syncBuffer
	ts = openTestStore(t, ts.dir, ts.clock, func(o *Options) {
		*o = ts.opts
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	assert.Equal(t, int64(0), counterValue(collectMetrics(t, reader), "telemetry.store.table_errors"), "Open does not open tables")
	for range 3 {
		_, err := ts.Latest(ctx, "dev", 10)
		require.ErrorIs(t, err, buckets.ErrUnavailable)
	}
	assert.Equal(t, int64(1), counterValue(collectMetrics(t, reader), "telemetry.store.table_errors"))
	assert.Equal(t, 1, strings.Count(logs.String(), "day table cannot be opened"), "logged once per failure:\n%s", logs.String())
	assert.Contains(t, logs.String(), "day="+bad.String())

	// After the back-off the store tries again (and fails again).
	ts.clock.Advance(reopenAfter)
	_, err := ts.Latest(ctx, "dev", 10)
	require.ErrorIs(t, err, buckets.ErrUnavailable)
	assert.Equal(t, int64(2), counterValue(collectMetrics(t, reader), "telemetry.store.table_errors"))
}
