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

// Cluster-wide drops. DELETE /v1/tables/{day} through any node drops the
// day on every live node; a node that was down (or unreachable) missed
// it. The drop is therefore also recorded in a second key-value bucket,
// <Bucket>_DROPS, key day.<YYYY-MM-DD>, value the drop time: every node
// watches it, drops a day it still holds that was dropped cluster-wide
// after its own last drop of that day (once the DELETE that recorded it
// has gone round the live nodes, so it never races with it), and never
// writes a reading of a
// dropped day from a message the stream stored before the drop (a new
// owner replaying the stream included). Records are kept as long as
// the store keeps its tombstones.

// dropKeep is how long a cluster-wide drop is remembered (the store's
// tombstones are kept as long).
const dropKeep = 400 * 24 * time.Hour

const dropKeyPrefix = "day."

// pendingDropWait is how long a drop whose DELETE never reported back
// (the node handling it died mid-way) waits before nodes apply it.
const pendingDropWait = 5 * time.Minute

// dropRecord is the value of a drop's key. Done is set once the DELETE
// has been sent to every live node.
type dropRecord struct {
	Dropped time.Time `json:"dropped"`
	Done    bool      `json:"done"`
}

// drop is a recorded drop.
type drop struct {
	at   time.Time
	done bool
}

// openDrops creates (or opens) the drops bucket and reads it.
func (m *Membership) openDrops(ctx context.Context) error {
	if m.js == nil { // NewOn
		return m.readDrops(ctx)
	}
	kv, err := m.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      m.cfg.Bucket + "_DROPS",
		Description: "telemetryd: days dropped cluster-wide (DELETE /v1/tables/{day}) and when",
		History:     1,
		TTL:         dropKeep,
		MaxBytes:    bucketMaxBytes,
		Storage:     jetstream.FileStorage,
		Replicas:    m.cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("ownership: bucket %s_DROPS: %w", m.cfg.Bucket, err)
	}
	m.mu.Lock()
	m.dropsKV = kv
	m.mu.Unlock()
	return m.readDrops(ctx)
}

// readDrops reads every recorded drop.
func (m *Membership) readDrops(ctx context.Context) error {
	m.mu.Lock()
	kv := m.dropsKV
	m.mu.Unlock()
	keys, err := kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return fmt.Errorf("ownership: list drops: %w", err)
	}
	drops := map[buckets.Day]drop{}
	deletes := map[buckets.DeviceID]drop{}
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("ownership: read drop %s: %w", k, err)
		}
		if dev, d, ok := parseDelete(e); ok {
			deletes[dev] = d
			continue
		}
		day, d, ok := parseDrop(e)
		if !ok {
			m.log.Warn("ignoring a malformed cluster-wide drop record", "key", k)
			continue
		}
		drops[day] = d
	}
	m.mu.Lock()
	m.drops, m.deletes, m.lastDrops = drops, deletes, m.cfg.Now()
	m.mu.Unlock()
	return nil
}

func parseDrop(e jetstream.KeyValueEntry) (buckets.Day, drop, bool) {
	return parseRecord(e, dropKeyPrefix, buckets.ParseDay)
}

// parseRecord reads a drop record under prefix (a day drop or a device
// delete) whose key names what parse accepts; ok is false for any other
// key or a malformed value.
func parseRecord[K any](e jetstream.KeyValueEntry, prefix string, parse func(string) (K, error)) (K, drop, bool) {
	var zero K
	s, ok := strings.CutPrefix(e.Key(), prefix)
	if !ok {
		return zero, drop{}, false
	}
	k, err := parse(s)
	if err != nil {
		return zero, drop{}, false
	}
	var r dropRecord
	if json.Unmarshal(e.Value(), &r) != nil || r.Dropped.IsZero() {
		return zero, drop{}, false
	}
	return k, drop{at: r.Dropped, done: r.Done}, true
}

// RecordDrop records that day is dropped cluster-wide at at: first
// before the DELETE goes round the live nodes (done false), then once
// more after it (done true).
func (m *Membership) RecordDrop(ctx context.Context, day buckets.Day, at time.Time, done bool) error {
	if err := m.putRecord(ctx, dropKeyPrefix+day.String(), "the drop of "+day.String(), at, done); err != nil {
		return err
	}
	m.mu.Lock()
	m.drops[day] = drop{at: at, done: done}
	m.mu.Unlock()
	return nil
}

// putRecord writes a drop record (what: the day drop or device delete
// it records) under key.
func (m *Membership) putRecord(ctx context.Context, key, what string, at time.Time, done bool) error {
	b, err := json.Marshal(dropRecord{Dropped: at.UTC(), Done: done})
	if err != nil {
		return fmt.Errorf("ownership: encode %s: %w", what, err)
	}
	m.mu.Lock()
	kv := m.dropsKV
	m.mu.Unlock()
	if kv == nil {
		return errors.New("ownership: drops bucket not open")
	}
	if _, err := kv.Put(ctx, key, b); err != nil {
		return fmt.Errorf("ownership: record %s: %w", what, err)
	}
	return nil
}

// Drops returns the days dropped cluster-wide and when, as last read,
// for a node to apply: those whose DELETE went round the live nodes,
// or that have waited pendingDropWait for it.
func (m *Membership) Drops() map[buckets.Day]time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return due(m.drops, m.cfg.Now())
}

// due returns the records of log a node applies at now: those whose
// DELETE went round the live nodes, or that have waited pendingDropWait
// for it. m.mu is held.
func due[K comparable](log map[K]drop, now time.Time) map[K]time.Time {
	out := make(map[K]time.Time, len(log))
	for k, d := range log {
		if d.done || now.Sub(d.at) >= pendingDropWait {
			out[k] = d.at
		}
	}
	return out
}

// DroppedAt reports when day was dropped cluster-wide, as last read
// (DELETE gone round or not: no message stored before it is written).
func (m *Membership) DroppedAt(day buckets.Day) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.drops[day]
	return d.at, ok
}
