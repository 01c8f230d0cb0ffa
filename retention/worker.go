package retention

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/buckets"
)

// Dropper is what the worker needs from the store.
type Dropper interface {
	// Tables lists the day tables with their sizes.
	Tables(ctx context.Context) ([]buckets.TableInfo, error)
	// DropTable drops the table of day as a whole. It wraps
	// buckets.ErrNotFound when there is no such table.
	DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error)
}

// RollupDropper is implemented by a Dropper that also keeps rollups
// with retentions of their own: every run that is not a dry run then
// also drops the rollup periods expired at its start.
type RollupDropper interface {
	DropExpiredRollups(ctx context.Context, now time.Time) (int, error)
}

// Defaults of Config.
const (
	DefaultInterval = time.Hour
	DefaultJitter   = 0.1
)

// Config configures a Worker. Only Policy.Retention is required.
type Config struct {
	Policy Policy
	// Interval is the time between two runs (default 1h).
	Interval time.Duration
	// Jitter spreads the runs: each wait is Interval +/- Jitter*Interval,
	// uniformly. Zero means DefaultJitter; it must be below 1.
	Jitter float64

	Logger         *slog.Logger         // nil: slog.Default()
	TracerProvider trace.TracerProvider // nil: the otel global
	MeterProvider  metric.MeterProvider // nil: the otel global
	Now            func() time.Time     // nil: time.Now
	Rand           func() float64       // nil: math/rand/v2; returns [0, 1)
}

// Worker applies the retention policy: once when Run starts, then every
// Interval (with jitter), and on demand through RunOnce.
type Worker struct {
	d        Dropper
	policy   Policy
	interval time.Duration
	jitter   float64
	log      *slog.Logger
	tracer   trace.Tracer
	now      func() time.Time
	rand     func() float64
	m        instruments

	// sem serialises runs; a caller waiting for it still honours its
	// context.
	sem chan struct{}
}

// NewWorker checks cfg, fills in the defaults and builds a worker that
// drops tables through d.
func NewWorker(d Dropper, cfg Config) (*Worker, error) {
	switch {
	case d == nil:
		return nil, errors.New("retention: nil Dropper")
	case cfg.Policy.Retention <= 0:
		return nil, fmt.Errorf("retention: Retention %s must be positive", cfg.Policy.Retention)
	case cfg.Policy.MaxBytes < 0:
		return nil, fmt.Errorf("retention: MaxBytes %d must not be negative", cfg.Policy.MaxBytes)
	case cfg.Interval < 0:
		return nil, fmt.Errorf("retention: Interval %s must not be negative", cfg.Interval)
	case cfg.Jitter < 0 || cfg.Jitter >= 1:
		return nil, fmt.Errorf("retention: Jitter %g must be in [0, 1)", cfg.Jitter)
	}
	w := &Worker{
		d:        d,
		policy:   cfg.Policy,
		interval: cmp.Or(cfg.Interval, DefaultInterval),
		jitter:   cmp.Or(cfg.Jitter, DefaultJitter),
		log:      cfg.Logger,
		now:      cfg.Now,
		rand:     cfg.Rand,
		sem:      make(chan struct{}, 1),
	}
	if w.log == nil {
		w.log = slog.Default()
	}
	if w.now == nil {
		w.now = time.Now
	}
	if w.rand == nil {
		w.rand = rand.Float64
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	w.tracer = tp.Tracer(instrumentationName)
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	var err error
	if w.m, err = newInstruments(mp.Meter(instrumentationName)); err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	return w, nil
}

// CountDrop counts a table dropped outside a run (an operator's drop,
// d.Reason "manual") in telemetry.retention.tables_dropped and
// bytes_freed, so the counters hold every drop whoever made it.
func (w *Worker) CountDrop(ctx context.Context, d buckets.TableDrop) { w.m.dropped(ctx, d) }

// Run applies the policy at once, then every Interval with jitter,
// until ctx is done; it then returns nil. A failed run is logged and
// the next one happens on schedule.
func (w *Worker) Run(ctx context.Context) error {
	for {
		if _, err := w.RunOnce(ctx, false); err != nil && ctx.Err() == nil {
			w.log.Error("retention run failed", "err", err)
		}
		timer := time.NewTimer(w.nextWait())
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
	}
}

// nextWait is Interval +/- Jitter*Interval.
func (w *Worker) nextWait() time.Duration {
	f := 1 + w.jitter*(2*w.rand()-1)
	return time.Duration(float64(w.interval) * f)
}

// RunOnce lists the tables, chooses with Expired and drops the chosen
// ones, oldest first. A dry run drops nothing and reports what it
// would drop; its Kept and BytesNow describe what the run would leave.
//
// A table that fails to drop is counted as kept and the others are
// still dropped; the failures are returned joined, alongside the
// report. A table that is already gone (buckets.ErrNotFound, e.g.
// dropped by an admin meanwhile) is not a failure. Runs are serialised.
func (w *Worker) RunOnce(ctx context.Context, dryRun bool) (rep buckets.RetentionReport, err error) {
	select {
	case w.sem <- struct{}{}:
		defer func() { <-w.sem }()
	case <-ctx.Done():
		return buckets.RetentionReport{DryRun: dryRun}, fmt.Errorf("retention run: %w", ctx.Err())
	}

	start := w.now()
	ctx, span := w.tracer.Start(ctx, "retention.run", trace.WithAttributes(attribute.Bool("dry_run", dryRun)))
	defer func() {
		w.m.finish(ctx, dryRun, w.now().Sub(start), err)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "retention run failed")
		}
		span.End()
	}()

	tables, err := w.d.Tables(ctx)
	if err != nil {
		return buckets.RetentionReport{DryRun: dryRun, Started: start}, fmt.Errorf("retention run: list tables: %w", err)
	}
	drops, cutoff := Expired(tables, start, w.policy)
	rep = buckets.RetentionReport{DryRun: dryRun, Started: start, Cutoff: cutoff, Kept: len(tables)}
	for _, t := range tables {
		rep.BytesNow += t.SizeBytes
	}
	span.SetAttributes(attribute.String("cutoff", cutoff.UTC().Format(time.RFC3339Nano)), attribute.Int("tables", len(tables)))

	var errs []error
	for _, d := range drops {
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("retention run stopped before dropping %s: %w", d.Day, context.Cause(ctx)))
			break
		}
		done, gone, derr := w.drop(ctx, span, d, dryRun)
		if derr != nil {
			errs = append(errs, derr)
			continue
		}
		if !gone {
			rep.Dropped = append(rep.Dropped, done)
		}
		rep.Kept--
		rep.BytesNow -= d.SizeBytes
	}
	if rd, ok := w.d.(RollupDropper); ok && !dryRun && ctx.Err() == nil {
		if n, err := rd.DropExpiredRollups(ctx, start); err != nil {
			errs = append(errs, err)
		} else if n > 0 {
			span.SetAttributes(attribute.Int("rollup_periods_dropped", n))
		}
	}
	span.SetAttributes(attribute.Int("dropped", len(rep.Dropped)), attribute.Int("kept", rep.Kept))
	w.log.Debug("retention run finished", "dry_run", dryRun, "cutoff", cutoff, "dropped", len(rep.Dropped),
		"kept", rep.Kept, "bytes_now", rep.BytesNow, "failed", len(errs))
	return rep, errors.Join(errs...)
}

// drop drops one chosen table (or, on a dry run, only reports it) and
// records it in the log, the span and the metrics. gone is true when
// the table had already been dropped by someone else.
func (w *Worker) drop(ctx context.Context, span trace.Span, d buckets.TableDrop, dryRun bool) (done buckets.TableDrop, gone bool, err error) {
	if dryRun {
		span.AddEvent("table.would_drop", trace.WithAttributes(dropAttrs(d)...))
		w.log.Info("retention would drop table", dropLogAttrs(d)...)
		return d, false, nil
	}
	res, err := w.d.DropTable(ctx, d.Day)
	if errors.Is(err, buckets.ErrNotFound) {
		w.log.Info("retention found table already dropped", "day", d.Day.String())
		return d, true, nil
	}
	if err != nil {
		span.AddEvent("table.drop_failed", trace.WithAttributes(append(dropAttrs(d), attribute.String("error", err.Error()))...))
		return d, false, fmt.Errorf("drop table %s (%s): %w", d.Day, d.Reason, err)
	}
	// The store measured the table as it dropped it; trust its numbers.
	if res.Day == d.Day {
		d.SizeBytes, d.Readings = res.SizeBytes, res.Readings
	}
	span.AddEvent("table.dropped", trace.WithAttributes(dropAttrs(d)...))
	w.log.Info("retention dropped table", dropLogAttrs(d)...)
	w.m.dropped(ctx, d)
	return d, false, nil
}

func dropAttrs(d buckets.TableDrop) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("day", d.Day.String()),
		attribute.Int64("size_bytes", d.SizeBytes),
		attribute.String("reason", d.Reason),
	}
}

func dropLogAttrs(d buckets.TableDrop) []any {
	return []any{"day", d.Day.String(), "size_bytes", d.SizeBytes, "readings", d.Readings, "reason", d.Reason}
}
