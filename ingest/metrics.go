package ingest

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/buckets"
)

const instrumentationName = "github.com/telemetryd/telemetryd/ingest"

// metrics holds the instruments listed in cmd/telemetryd/OPERATIONS.md. Attribute sets of the hot
// path are built once.
type metrics struct {
	readings     metric.Int64Counter     // telemetry.ingest.readings {outcome, code}
	messages     metric.Int64Counter     // telemetry.ingest.messages {outcome}
	batchSize    metric.Int64Histogram   // telemetry.ingest.batch.size
	lag          metric.Float64Histogram // telemetry.ingest.lag
	redeliveries metric.Int64Counter     // telemetry.ingest.redeliveries

	accepted, acked, nak, rejected metric.MeasurementOption
	skippedDropped                 metric.MeasurementOption // readings of a dropped day in a replay
	skippedDeleted                 metric.MeasurementOption // readings of a deleted device in a replay
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	m := mp.Meter(instrumentationName)
	var err error
	out := &metrics{
		accepted: metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "accepted"))),
		acked:    metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "acked"))),
		nak:      metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "nak"))),
		rejected: metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "rejected"))),
		skippedDropped: metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "skipped"),
			attribute.String("code", string(buckets.CodeDayDropped)))),
		skippedDeleted: metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "skipped"),
			attribute.String("code", string(buckets.CodeDeviceDeleted)))),
	}
	if out.readings, err = m.Int64Counter("telemetry.ingest.readings",
		metric.WithDescription("Readings ingested, by outcome (accepted, rejected, skipped) and code."),
		metric.WithUnit("{reading}")); err != nil {
		return nil, fmt.Errorf("readings counter: %w", err)
	}
	if out.messages, err = m.Int64Counter("telemetry.ingest.messages",
		metric.WithDescription("NATS messages settled, by outcome (acked, rejected, nak)."),
		metric.WithUnit("{message}")); err != nil {
		return nil, fmt.Errorf("messages counter: %w", err)
	}
	if out.batchSize, err = m.Int64Histogram("telemetry.ingest.batch.size",
		metric.WithDescription("Readings per store commit."),
		metric.WithUnit("{reading}"),
		metric.WithExplicitBucketBoundaries(1, 10, 50, 100, 500, 1000, 2500, 5000, 10000)); err != nil {
		return nil, fmt.Errorf("batch size histogram: %w", err)
	}
	if out.lag, err = m.Float64Histogram("telemetry.ingest.lag",
		metric.WithDescription("Time from a reading's event time to its commit."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 3600, 86400)); err != nil {
		return nil, fmt.Errorf("lag histogram: %w", err)
	}
	if out.redeliveries, err = m.Int64Counter("telemetry.ingest.redeliveries",
		metric.WithDescription("Messages received with a delivery count above one."),
		metric.WithUnit("{message}")); err != nil {
		return nil, fmt.Errorf("redeliveries counter: %w", err)
	}
	// The counters are exported from the start (at 0), so a rate or an
	// alert sees their series before the first message.
	ctx := context.Background()
	out.readings.Add(ctx, 0, out.accepted)
	for _, o := range []metric.AddOption{out.acked, out.rejected, out.nak} {
		out.messages.Add(ctx, 0, o)
	}
	out.redeliveries.Add(ctx, 0)
	return out, nil
}

// rejectedReadings is the attribute set for readings rejected with code.
func rejectedReadings(code buckets.Code) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String("outcome", "rejected"), attribute.String("code", string(code)))
}

// recordLag records the lag of every reading of rs, committed at now.
// Only the first is recorded with ctx, which holds the batch span and so
// makes it the exemplar; the others go without it, which spares the SDK
// an exemplar offer per reading (a third of the cost, on the batch
// loop's path).
func (m *metrics) recordLag(ctx context.Context, rs []buckets.Reading, now buckets.Ticks) {
	for i := range rs {
		c := context.Background()
		if i == 0 {
			c = ctx
		}
		m.lag.Record(c, max(float64(now-rs[i].Ticks)/buckets.TicksPerSecond, 0))
	}
}
