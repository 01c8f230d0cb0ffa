package ownership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
	s, ok := strings.CutPrefix(e.Key(), deleteKeyPrefix)
	if !ok {
		return "", drop{}, false
	}
	dev, err := buckets.ParseDeviceID(s)
	if err != nil {
		return "", drop{}, false
	}
	var r dropRecord
	if json.Unmarshal(e.Value(), &r) != nil || r.Dropped.IsZero() {
		return "", drop{}, false
	}
	return dev, drop{at: r.Dropped, done: r.Done}, true
}

// RecordDelete records that dev is deleted cluster-wide at at: first
// before the DELETE goes round the live nodes (done false), then once
// more after it (done true).
func (m *Membership) RecordDelete(ctx context.Context, dev buckets.DeviceID, at time.Time, done bool) error {
	b, err := json.Marshal(dropRecord{Dropped: at.UTC(), Done: done})
	if err != nil {
		return fmt.Errorf("ownership: encode device delete: %w", err)
	}
	m.mu.Lock()
	kv := m.dropsKV
	m.mu.Unlock()
	if kv == nil {
		return errors.New("ownership: drops bucket not open")
	}
	if _, err := kv.Put(ctx, deleteKeyPrefix+string(dev), b); err != nil {
		return fmt.Errorf("ownership: record the delete of device %s: %w", dev, err)
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
	out := make(map[buckets.DeviceID]time.Time, len(m.deletes))
	for dev, d := range m.deletes {
		if d.done || m.cfg.Now().Sub(d.at) >= pendingDropWait {
			out[dev] = d.at
		}
	}
	return out
}

// DeletedAt reports when dev was deleted cluster-wide, as last read
// (DELETE gone round or not: no message stored before it is written).
func (m *Membership) DeletedAt(dev buckets.DeviceID) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.deletes[dev]
	return d.at, ok
}
