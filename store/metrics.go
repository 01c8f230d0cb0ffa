package store

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// instrumentationName names the meter and the tracer of this package.
const instrumentationName = "github.com/telemetryd/telemetryd/store"

// metrics holds the instruments listed in cmd/telemetryd/OPERATIONS.md that the store owns.
type metrics struct {
	commitDuration metric.Float64Histogram
	tableErrors    metric.Int64Counter
	compactions    metric.Int64Counter
	corruptBlocks  metric.Int64Counter
	backups        metric.Int64Counter // by outcome (Store.Backup)
	backupBytes    metric.Int64Counter
	registration   metric.Registration
	health         metric.Registration // blocked tables (health.go)
}

// newMetrics creates the instruments. The observable gauges read the
// store through s when a reader collects them.
func newMetrics(mp metric.MeterProvider, s *Store) (*metrics, error) {
	meter := mp.Meter(instrumentationName)
	m := &metrics{}
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
		st := s.stats()
		o.ObserveInt64(tables, int64(st.tables))
		o.ObserveInt64(bytes, st.bytes)
		o.ObserveInt64(open, int64(st.open))
		o.ObserveInt64(lastBackup, s.lastBackup.Load())
		hits, misses := s.cols.Stats()
		o.ObserveInt64(colLookups, hits, hit)
		o.ObserveInt64(colLookups, misses, miss)
		return nil
	}, tables, bytes, open, lastBackup, colLookups)
	if err != nil {
		return nil, fmt.Errorf("register store gauges: %w", err)
	}
	if m.health, err = s.registerHealthGauge(meter); err != nil {
		_ = m.registration.Unregister()
		return nil, err
	}
	return m, nil
}

// newCounters creates the histogram and the counters, exported from the
// start (at 0) so an alert sees the series before the first event.
func (m *metrics) newCounters(meter metric.Meter) error {
	var err error
	if m.commitDuration, err = meter.Float64Histogram("telemetry.store.commit.duration",
		metric.WithDescription("Time to commit one Write to the day tables and the device index."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)); err != nil {
		return fmt.Errorf("commit duration histogram: %w", err)
	}
	if m.tableErrors, err = meter.Int64Counter("telemetry.store.table_errors",
		metric.WithDescription("Day tables that failed to open (damaged or unreadable)."),
		metric.WithUnit("{error}")); err != nil {
		return fmt.Errorf("table errors counter: %w", err)
	}
	if m.compactions, err = meter.Int64Counter("telemetry.store.compactions",
		metric.WithDescription("Merges of a device's open blocks into sealed blocks."),
		metric.WithUnit("{compaction}")); err != nil {
		return fmt.Errorf("compactions counter: %w", err)
	}
	if m.corruptBlocks, err = meter.Int64Counter("telemetry.store.corrupt_blocks",
		metric.WithDescription("Stored blocks (kind=block) and device index records (kind=device_index_record) found corrupt: checksum mismatch or undecodable. Each block counts once per process; queries skip it with a warning."),
		metric.WithUnit("{block}")); err != nil {
		return fmt.Errorf("corrupt blocks counter: %w", err)
	}
	if m.backups, err = meter.Int64Counter("telemetry.store.backups",
		metric.WithDescription("Backups taken (outcome=ok) or failed (outcome=failed)."),
		metric.WithUnit("{backup}")); err != nil {
		return fmt.Errorf("backups counter: %w", err)
	}
	if m.backupBytes, err = meter.Int64Counter("telemetry.store.backup.copied",
		metric.WithDescription("Bytes written into backup directories."),
		metric.WithUnit("By")); err != nil {
		return fmt.Errorf("backup bytes counter: %w", err)
	}
	m.tableErrors.Add(context.Background(), 0)
	m.compactions.Add(context.Background(), 0)
	m.backups.Add(context.Background(), 0, metric.WithAttributes(outcomeOK))
	m.backups.Add(context.Background(), 0, metric.WithAttributes(outcomeFailed))
	m.backupBytes.Add(context.Background(), 0)
	return nil
}

// The outcome attributes of telemetry.store.backups.
var (
	outcomeOK     = attribute.String("outcome", "ok")
	outcomeFailed = attribute.String("outcome", "failed")
)
