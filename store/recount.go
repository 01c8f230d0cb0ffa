package store

import (
	"context"
	"slices"

	"github.com/telemetryd/telemetryd/buckets"
)

// RecountUnknown opens, one at a time, every day table whose reading
// count is not known (it was being written when the process last
// stopped without closing it, so it has no count file), which makes
// Badger replay its log and the store read its count; the compactor
// then settles it (settle.go), saving its count file, before the next
// one is opened, and it is closed again by the usual idle and LRU
// rules. Tables then report their count in Tables without
// waiting for a query to open them. Tables that fail to open keep
// reporting -1 (and are logged once by the open). It returns when every
// such table was tried or ctx is done; the service runs it in the
// background after start.
func (s *Store) RecountUnknown(ctx context.Context) error {
	if s.opts.ReadOnly {
		return nil
	}
	s.mu.Lock()
	var days []buckets.Day
	for d, t := range s.tables {
		if t.readings.Load() < 0 && !t.dropping && t.failErr == nil && t.db == nil {
			days = append(days, d)
		}
	}
	s.mu.Unlock()
	slices.Sort(days)
	counted := 0
	for _, d := range days {
		if err := ctx.Err(); err != nil {
			return err
		}
		t, err := s.acquire(ctx, d, forRead)
		if err != nil {
			continue // logged by the open; reported as -1
		}
		if t == nil {
			continue // dropped meanwhile
		}
		s.release(t)
		if err := s.settleNow(ctx, d); err != nil {
			return err
		}
		counted++
	}
	if counted > 0 {
		s.log.Info("counted the readings of day tables not closed cleanly", "tables", counted)
	}
	return nil
}
