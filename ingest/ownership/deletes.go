package ownership

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/buckets"
)

// Cluster-wide device deletes. DELETE /v1/devices/{device} through any
// node deletes the device on every live node, and is recorded in the
// drops bucket beside the day drops, key device.<device>, value the
// delete time (and whether the DELETE has gone round the live nodes),
// exactly as a day drop is: every node reads the records with the
// drops and applies a delete newer than its own last delete of the
// device (ingest/cluster: it records the tombstone at the cluster-wide
// time and removes what it holds, before it consumes), and never writes
// a reading or an attribute of the device from a message the stream
// stored before the delete (a new owner replaying the stream included).
// Records expire with the bucket's TTL, as long as the store keeps its
// tombstones.

const deleteKeyPrefix = "device."

// parseDelete reads a device delete record; ok is false for any other
// key or a malformed value.
func parseDelete(e jetstream.KeyValueEntry) (buckets.DeviceID, drop, bool) {
	return parseRecord(e, deleteKeyPrefix, buckets.ParseDeviceID)
}

// RecordDelete records that dev is deleted cluster-wide at at: first
// before the DELETE goes round the live nodes (done false), then once
// more after it (done true).
func (m *Membership) RecordDelete(ctx context.Context, dev buckets.DeviceID, at time.Time, done bool) error {
	if err := m.putRecord(ctx, deleteKeyPrefix+string(dev), "the delete of device "+string(dev), at, done); err != nil {
		return err
	}
	m.mu.Lock()
	if m.deletes == nil {
		m.deletes = map[buckets.DeviceID]drop{}
	}
	m.deletes[dev] = drop{at: at, done: done}
	m.mu.Unlock()
	return nil
}

// Deletes returns the devices deleted cluster-wide and when, as last
// read, for a node to apply: those whose DELETE went round the live
// nodes, or that have waited pendingDropWait for it.
func (m *Membership) Deletes() map[buckets.DeviceID]time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return due(m.deletes, m.cfg.Now())
}

// DeletedAt reports when dev was deleted cluster-wide, as last read
// (DELETE gone round or not: no message stored before it is written).
func (m *Membership) DeletedAt(dev buckets.DeviceID) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.deletes[dev]
	return d.at, ok
}
