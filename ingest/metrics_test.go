package ingest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/telemetryd/telemetryd/buckets"
)

// Every reading of a batch counts in the lag histogram; the batch's
// trace is its exemplar.
func TestRecordLagCountsEveryReadingWithTheBatchAsExemplar(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	m, err := newMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	require.NoError(t, err)
	ctx, span := sdktrace.NewTracerProvider().Tracer("test").Start(context.Background(), "ingest.batch")
	defer span.End()
	now := buckets.Ticks(1000 * buckets.TicksPerSecond)
	rs := []buckets.Reading{{Ticks: now - 2*buckets.TicksPerSecond}, {Ticks: now - 2*buckets.TicksPerSecond}, {Ticks: now}, {Ticks: now + buckets.TicksPerSecond}}

	m.recordLag(ctx, rs, now)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	require.Len(t, rm.ScopeMetrics, 1)
	var lag *metricdata.Histogram[float64]
	for _, mt := range rm.ScopeMetrics[0].Metrics {
		if h, ok := mt.Data.(metricdata.Histogram[float64]); ok && mt.Name == "telemetry.ingest.lag" {
			lag = &h
		}
	}
	require.NotNil(t, lag)
	require.Len(t, lag.DataPoints, 1)
	dp := lag.DataPoints[0]
	assert.Equal(t, uint64(4), dp.Count)
	assert.InDelta(t, 4.0, dp.Sum, 1e-9, "2 s twice, 0, and a future reading counted as 0")
	require.Len(t, dp.Exemplars, 1)
	assert.Equal(t, [16]byte(span.SpanContext().TraceID()), [16]byte(dp.Exemplars[0].TraceID))
	assert.Equal(t, 2.0, dp.Exemplars[0].Value, "the first reading of the batch")
}
