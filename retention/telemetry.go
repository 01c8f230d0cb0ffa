package retention

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/buckets"
)

// instrumentationName names the tracer and the meter.
const instrumentationName = "github.com/telemetryd/telemetryd/retention"

// Outcomes of a run, the outcome attribute of telemetry.retention.runs.
const (
	outcomeOK    = "ok"
	outcomeError = "error"
)

// instruments are the retention metrics (cmd/telemetryd/OPERATIONS.md).
type instruments struct {
	tablesDropped metric.Int64Counter     // telemetry.retention.tables_dropped{reason}
	bytesFreed    metric.Int64Counter     // telemetry.retention.bytes_freed{reason}
	runDuration   metric.Float64Histogram // telemetry.retention.run.duration{outcome,dry_run}
	runs          metric.Int64Counter     // telemetry.retention.runs{outcome,dry_run}
}

func newInstruments(m metric.Meter) (instruments, error) {
	var in instruments
	var err error
	if in.tablesDropped, err = m.Int64Counter("telemetry.retention.tables_dropped",
		metric.WithDescription("Day tables dropped by retention."), metric.WithUnit("{table}")); err != nil {
		return in, err
	}
	if in.bytesFreed, err = m.Int64Counter("telemetry.retention.bytes_freed",
		metric.WithDescription("Bytes freed by dropping day tables."), metric.WithUnit("By")); err != nil {
		return in, err
	}
	if in.runDuration, err = m.Float64Histogram("telemetry.retention.run.duration",
		metric.WithDescription("Duration of one retention run."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)); err != nil {
		return in, err
	}
	if in.runs, err = m.Int64Counter("telemetry.retention.runs",
		metric.WithDescription("Retention runs, by outcome."), metric.WithUnit("{run}")); err != nil {
		return in, err
	}
	// Every reason is exported from the start (at 0), so a rate or an
	// alert sees the series before the first drop.
	for _, r := range []string{ReasonExpired, ReasonSizeLimit, ReasonManual} {
		attrs := metric.WithAttributes(attribute.String("reason", r))
		in.tablesDropped.Add(context.Background(), 0, attrs)
		in.bytesFreed.Add(context.Background(), 0, attrs)
	}
	return in, nil
}

// dropped counts one table actually dropped.
func (in instruments) dropped(ctx context.Context, d buckets.TableDrop) {
	attrs := metric.WithAttributes(attribute.String("reason", d.Reason))
	in.tablesDropped.Add(ctx, 1, attrs)
	in.bytesFreed.Add(ctx, max(d.SizeBytes, 0), attrs)
}

// finish records the end of a run.
func (in instruments) finish(ctx context.Context, dryRun bool, took time.Duration, err error) {
	outcome := outcomeOK
	if err != nil {
		outcome = outcomeError
	}
	attrs := metric.WithAttributes(attribute.String("outcome", outcome), attribute.Bool("dry_run", dryRun))
	in.runs.Add(ctx, 1, attrs)
	in.runDuration.Record(ctx, took.Seconds(), attrs)
}
