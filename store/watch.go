package store

import (
	"sync"

	"github.com/telemetryd/telemetryd/buckets"
)

// watchers are the functions Watch registered.
type watchers struct {
	mu   sync.RWMutex
	next int
	set  map[int]watchFuncs
}

type watchFuncs struct {
	committed func([]buckets.Reading)
	removed   func(buckets.DeviceID)
}

// Watch tells committed and removed of every change to the stored
// readings until stop is called, so that a copy of recent readings kept
// beside the store (the query API's window of recent samples) stays
// what the store holds:
//
//   - committed gets the readings of one table commit once it
//     committed, before the table takes its next write: the commits of
//     one day table arrive in the order they were made. It must be
//     quick, must not keep rs and must not call the store.
//   - removed is called once readings may have gone or changed other
//     than by a commit: those of dev (a device deleted), or of any
//     device when dev is empty (a table dropped, a commit that failed
//     part way).
func (s *Store) Watch(committed func(rs []buckets.Reading), removed func(dev buckets.DeviceID)) (stop func()) {
	w := &s.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.set == nil {
		w.set = map[int]watchFuncs{}
	}
	id := w.next
	w.next++
	w.set[id] = watchFuncs{committed, removed}
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.set, id)
	}
}

func (s *Store) watchCommitted(rs []buckets.Reading) {
	s.watch.mu.RLock()
	defer s.watch.mu.RUnlock()
	for _, f := range s.watch.set {
		f.committed(rs)
	}
}

func (s *Store) watchRemoved(dev buckets.DeviceID) {
	s.watch.mu.RLock()
	defer s.watch.mu.RUnlock()
	for _, f := range s.watch.set {
		f.removed(dev)
	}
}
