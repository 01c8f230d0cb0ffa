package store

import (
	"context"

	"github.com/telemetryd/telemetryd/buckets"
)

// The compactor gives way to queries (package giveway).

// acquireQuery is acquire for a query: it records that a query came.
func (s *Store) acquireQuery(ctx context.Context, day buckets.Day) (*table, error) {
	s.queries.Began()
	return s.acquire(ctx, day, forRead)
}
