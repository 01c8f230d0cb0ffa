package store

import "github.com/telemetryd/telemetryd/buckets"

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
	return s.watch.Add(committed, removed)
}
