// Package storemetrics makes the store's OpenTelemetry instruments:
// the commit histogram, the counters of table errors, compactions,
// corrupt blocks and backups, and the gauges of tables, bytes, open
// tables, the last backup, the column cache and the blocked tables.
package storemetrics

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metrics holds the instruments listed in cmd/telemetryd/OPERATIONS.md
// that the store owns (but the rollups' own, package rollup).
type Metrics struct {
	CommitDuration metric.Float64Histogram
	TableErrors    metric.Int64Counter
	Compactions    metric.Int64Counter
	CorruptBlocks  metric.Int64Counter
	Backups        metric.Int64Counter // by outcome (Store.Backup)
	BackupBytes    metric.Int64Counter
	registration   metric.Registration
	health         metric.Registration // blocked tables
}

// Gauges is what the store's observable gauges report when a reader
// collects them.
type Gauges struct {
	Tables, Open int   // day tables on disk, open
	Bytes        int64 // on disk
	LastBackup   int64 // Unix seconds of the last backup (0: none)
	// ColumnHits and ColumnMisses count the column cache's lookups.
	ColumnHits, ColumnMisses int64
}

// New creates the instruments with meter. The observable gauges call
// gauges, and the blocked tables gauge blocked (the blocked tables by
// reason), when a reader collects them.
func New(meter metric.Meter, gauges func() Gauges, blocked func() map[string]int64) (*Metrics, error) {
	m := &Metrics{}
	if err := m.newCounters(meter); err != nil {
		return nil, err
	}
	tables, err := meter.Int64ObservableGauge("telemetry.store.tables",
		metric.WithDescription("Day tables on disk."), metric.WithUnit("{table}"))
	if err != nil {
		return nil, fmt.Errorf("tables gauge: %w", err)
	}
	bytes, err := meter.Int64ObservableGauge("telemetry.store.bytes",
		metric.WithDescription("Bytes on disk used by the day tables."), metric.WithUnit("By"))
	if err != nil {
		return nil, fmt.Errorf("bytes gauge: %w", err)
	}
	open, err := meter.Int64ObservableGauge("telemetry.store.open_tables",
		metric.WithDescription("Day tables currently open (hot and cold)."), metric.WithUnit("{table}"))
	if err != nil {
		return nil, fmt.Errorf("open tables gauge: %w", err)
	}
	lastBackup, err := meter.Int64ObservableGauge("telemetry.store.backup.last_success",
		metric.WithDescription("Unix time of the last backup that completed in this process (0: none yet)."), metric.WithUnit("s"))
	if err != nil {
		return nil, fmt.Errorf("last backup gauge: %w", err)
	}
	colLookups, err := meter.Int64ObservableCounter("telemetry.store.column_cache.lookups",
		metric.WithDescription("Lookups of decoded block columns by aggregates, by outcome (hit, miss)."), metric.WithUnit("{lookup}"))
	if err != nil {
		return nil, fmt.Errorf("column cache counter: %w", err)
	}
	hit, miss := metric.WithAttributes(attribute.String("outcome", "hit")), metric.WithAttributes(attribute.String("outcome", "miss"))
	m.registration, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		g := gauges()
		o.ObserveInt64(tables, int64(g.Tables))
		o.ObserveInt64(bytes, g.Bytes)
		o.ObserveInt64(open, int64(g.Open))
		o.ObserveInt64(lastBackup, g.LastBackup)
		o.ObserveInt64(colLookups, g.ColumnHits, hit)
		o.ObserveInt64(colLookups, g.ColumnMisses, miss)
		return nil
	}, tables, bytes, open, lastBackup, colLookups)
	if err != nil {
		return nil, fmt.Errorf("register store gauges: %w", err)
	}
	if m.health, err = registerBlockedGauge(meter, blocked); err != nil {
		_ = m.registration.Unregister()
		return nil, err
	}
	return m, nil
}

// newCounters creates the histogram and the counters, exported from the
// start (at 0) so an alert sees the series before the first event.
func (m *Metrics) newCounters(meter metric.Meter) error {
	var err error
	if m.CommitDuration, err = meter.Float64Histogram("telemetry.store.commit.duration",
		metric.WithDescription("Time to commit one Write to the day tables and the device index."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)); err != nil {
		return fmt.Errorf("commit duration histogram: %w", err)
	}
	if m.TableErrors, err = meter.Int64Counter("telemetry.store.table_errors",
		metric.WithDescription("Day tables that failed to open (damaged or unreadable)."),
		metric.WithUnit("{error}")); err != nil {
		return fmt.Errorf("table errors counter: %w", err)
	}
	if m.Compactions, err = meter.Int64Counter("telemetry.store.compactions",
		metric.WithDescription("Merges of a device's open blocks into sealed blocks."),
		metric.WithUnit("{compaction}")); err != nil {
		return fmt.Errorf("compactions counter: %w", err)
	}
	if m.CorruptBlocks, err = meter.Int64Counter("telemetry.store.corrupt_blocks",
		metric.WithDescription("Stored blocks (kind=block) and device index records (kind=device_index_record) found corrupt: checksum mismatch or undecodable. Each block counts once per process; queries skip it with a warning."),
		metric.WithUnit("{block}")); err != nil {
		return fmt.Errorf("corrupt blocks counter: %w", err)
	}
	if m.Backups, err = meter.Int64Counter("telemetry.store.backups",
		metric.WithDescription("Backups taken (outcome=ok) or failed (outcome=failed)."),
		metric.WithUnit("{backup}")); err != nil {
		return fmt.Errorf("backups counter: %w", err)
	}
	if m.BackupBytes, err = meter.Int64Counter("telemetry.store.backup.copied",
		metric.WithDescription("Bytes written into backup directories."),
		metric.WithUnit("By")); err != nil {
		return fmt.Errorf("backup bytes counter: %w", err)
	}
	m.TableErrors.Add(context.Background(), 0)
	m.Compactions.Add(context.Background(), 0)
	m.Backups.Add(context.Background(), 0, metric.WithAttributes(OutcomeOK))
	m.Backups.Add(context.Background(), 0, metric.WithAttributes(OutcomeFailed))
	m.BackupBytes.Add(context.Background(), 0)
	return nil
}

// Values of the kind attribute of telemetry.store.corrupt_blocks.
var (
	KindBlock  = metric.WithAttributes(attribute.String("kind", "block"))
	KindRecord = metric.WithAttributes(attribute.String("kind", "device_index_record"))
)

// The outcome attributes of telemetry.store.backups.
var (
	OutcomeOK     = attribute.String("outcome", "ok")
	OutcomeFailed = attribute.String("outcome", "failed")
)

// Unregister stops the observable gauges.
func (m *Metrics) Unregister() error {
	var errs []error
	if err := m.registration.Unregister(); err != nil {
		errs = append(errs, fmt.Errorf("unregister metrics: %w", err))
	}
	if err := m.health.Unregister(); err != nil {
		errs = append(errs, fmt.Errorf("unregister metrics: %w", err))
	}
	return errors.Join(errs...)
}

// registerBlockedGauge exports the blocked tables by reason.
func registerBlockedGauge(meter metric.Meter, blocked func() map[string]int64) (metric.Registration, error) {
	g, err := meter.Int64ObservableGauge("telemetry.store.blocked_tables",
		metric.WithDescription("Day tables that cannot commit, by reason (damaged: does not open; commit_failed: its commits fail; repairing). Their readings wait unacked in the stream."),
		metric.WithUnit("{table}"))
	if err != nil {
		return nil, fmt.Errorf("blocked tables gauge: %w", err)
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for reason, n := range blocked() {
			o.ObserveInt64(g, n, metric.WithAttributes(attribute.String("reason", reason)))
		}
		return nil
	}, g)
}
