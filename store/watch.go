package store

import (
	"sync/atomic"

	"github.com/telemetryd/telemetryd/buckets"
)

// Watcher is told of every change to the stored readings, so that a
// copy of recent readings kept beside the store (the query API's window
// of recent samples) stays what the store holds.
type Watcher interface {
	// Committed is called with the readings of one table commit once
	// it committed, before the table takes its next write: commits of
	// one day table arrive in the order they were made. It must be
	// quick, must not keep rs and must not call the store.
	Committed(rs []buckets.Reading)
	// Removed is called once readings may have gone or changed other
	// than by a commit: those of dev (a device deleted), or of any
	// device when dev is empty (a table dropped, a commit that failed
	// part way).
	Removed(dev buckets.DeviceID)
}

// watcher holds the Watcher set by Watch.
type watcher struct{ w atomic.Pointer[Watcher] }

// Watch makes w the store's watcher (nil: none), replacing any other.
func (s *Store) Watch(w Watcher) {
	if w == nil {
		s.watch.w.Store(nil)
		return
	}
	s.watch.w.Store(&w)
}

func (s *Store) watchCommitted(rs []buckets.Reading) {
	if w := s.watch.w.Load(); w != nil {
		(*w).Committed(rs)
	}
}

func (s *Store) watchRemoved(dev buckets.DeviceID) {
	if w := s.watch.w.Load(); w != nil {
		(*w).Removed(dev)
	}
}
