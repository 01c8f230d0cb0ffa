package store

import "github.com/telemetryd/telemetryd/buckets"

// syncAll fsyncs every open writable day table and the device index
// (Options.SyncEvery): without SyncWrites a commit is written to the
// operating system, and this bounds how long it may stay there. It runs
// on the compactor's goroutine, between compactions.
func (s *Store) syncAll() {
	for _, d := range s.daysBetween(0, 1<<31-1, buckets.Desc) {
		s.mu.Lock()
		t := s.tables[d]
		held := t != nil && s.holdOpen(t) // open and writable; t.db is ours to read until unhold
		s.mu.Unlock()
		if !held {
			continue
		}
		if err := t.db.Sync(); err != nil {
			s.log.Warn("sync day table", "day", d.String(), "err", err)
		}
		s.unhold(t)
	}
	if err := s.index.db.Sync(); err != nil {
		s.log.Warn("sync device index", "err", err)
	}
}
