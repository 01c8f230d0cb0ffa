package store

import (
	"github.com/telemetryd/telemetryd/store/storemetrics"
)

// instrumentationName names the meter and the tracer of this package.
const instrumentationName = "github.com/telemetryd/telemetryd/store"

// newMetrics creates the store's instruments (package storemetrics),
// whose gauges read s when a reader collects them.
func newMetrics(s *Store) (*storemetrics.Metrics, error) {
	return storemetrics.New(s.opts.MeterProvider.Meter(instrumentationName), func() storemetrics.Gauges {
		st := s.stats()
		hits, misses := s.cols.Stats()
		return storemetrics.Gauges{Tables: st.tables, Open: st.open, Bytes: st.bytes, LastBackup: s.lastBackup.Load(),
			ColumnHits: hits, ColumnMisses: misses}
	}, s.health.Counts)
}
