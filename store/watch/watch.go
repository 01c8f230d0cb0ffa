// Package watch keeps the functions told of every change to a store's
// readings: each commit's readings once committed, and the devices
// whose readings may have gone or changed otherwise.
package watch

import (
	"sync"

	"github.com/telemetryd/telemetryd/buckets"
)

// Set is the registered functions. The zero value is empty and ready.
type Set struct {
	mu   sync.RWMutex
	next int
	set  map[int]funcs
}

type funcs struct {
	committed func([]buckets.Reading)
	removed   func(buckets.DeviceID)
}

// Add registers committed and removed until stop is called.
func (w *Set) Add(committed func(rs []buckets.Reading), removed func(dev buckets.DeviceID)) (stop func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.set == nil {
		w.set = map[int]funcs{}
	}
	id := w.next
	w.next++
	w.set[id] = funcs{committed, removed}
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.set, id)
	}
}

// Committed tells every committed function of rs.
func (w *Set) Committed(rs []buckets.Reading) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	for _, f := range w.set {
		f.committed(rs)
	}
}

// Removed tells every removed function of dev (empty: any device).
func (w *Set) Removed(dev buckets.DeviceID) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	for _, f := range w.set {
		f.removed(dev)
	}
}
