package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// Deleting a device. DeleteDevice holds the drop gate exclusively for
// the whole delete, so no writer that checks tombstones (HoldDrops) is
// between its check and its write, and:
//
//  1. records a tombstone, the device and the wall-clock time of the
//     delete, in the device index database (key replay.DeviceTombPrefix
//     <device>, value the Unix nanoseconds, 8 bytes big-endian) and
//     syncs it. A writer replaying the stream skips the device's
//     readings and attribute assignments in messages the stream stored
//     before that time (DeletedAt), as it skips dropped days;
//  2. deletes every block key under "<device>/" in each day table that
//     the device's index bounds cover (first and last seen are never
//     narrower than what is stored), lowering the table's reading count
//     by the distinct readings removed, and forgets what the table's
//     compactor notes and write tracker hold of the device;
//  3. deletes the device's record, attribute record and index entities
//     from the index database in one transaction, and from memory (the
//     record, its latest values and the attribute postings).
//
// A failure after step 1 leaves the tombstone and the index record, so
// repeating the delete finishes it. Tombstones are kept as long as the
// tombstones of dropped days (replay.TombstoneKeep) and are copied by backups.

// deleteChunkKeys bounds the keys one transaction of a delete removes.
const deleteChunkKeys = 10_000

// DeletedAt reports when dev was last deleted, if within the time
// tombstones are kept. A writer skips the device's readings and
// attribute assignments in messages the stream stored before then.
func (s *Store) DeletedAt(dev buckets.DeviceID) (time.Time, bool) { return s.deletes.At(dev) }

// DeleteDevice deletes dev: its readings in every day table and its
// rollups, its device index record (first and last seen, latest
// values), its attributes and their index entities, after recording a
// tombstone at the present wall-clock time (see the comment at the top
// of this file). The error wraps buckets.ErrNotFound when the index does not
// know dev (then no tombstone is recorded), and buckets.ErrUnavailable
// for transient conditions (then repeating the delete finishes it).
func (s *Store) DeleteDevice(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error) {
	return s.deleteDevice(ctx, dev, time.Time{})
}

// DeleteDeviceAt applies a delete of dev made elsewhere at at (a
// cluster-wide delete this node missed): it records the tombstone at
// at whether or not the store knows dev, so that messages the stream
// stored before at are skipped and later ones written, and removes
// what the store holds of dev as DeleteDevice does. The error wraps
// buckets.ErrNotFound when it held nothing of dev.
func (s *Store) DeleteDeviceAt(ctx context.Context, dev buckets.DeviceID, at time.Time) (buckets.DeviceDelete, error) {
	if at.IsZero() {
		return buckets.DeviceDelete{Device: dev, Readings: -1}, fmt.Errorf("delete device %s: no delete time", dev)
	}
	return s.deleteDevice(ctx, dev, at)
}

// deleteDevice is DeleteDevice with the tombstone at at, or now if at
// is zero (then an unknown device records none).
func (s *Store) deleteDevice(ctx context.Context, dev buckets.DeviceID, at time.Time) (buckets.DeviceDelete, error) {
	out := buckets.DeviceDelete{Device: dev, Readings: -1}
	if err := dev.Validate(); err != nil {
		return out, err
	}
	if s.opts.ReadOnly {
		return out, fmt.Errorf("delete device %s: %w", dev, errReadOnly)
	}
	if err := s.Ping(ctx); err != nil {
		return out, err
	}
	if _, _, ok := s.index.Bounds(dev); !ok && at.IsZero() { // spares the gate
		return out, fmt.Errorf("device %s: %w", dev, buckets.ErrNotFound)
	}
	defer s.replay.LockDrops()()
	first, last, ok := s.index.Bounds(dev)
	if !ok && at.IsZero() {
		return out, fmt.Errorf("device %s: %w", dev, buckets.ErrNotFound)
	}
	if at.IsZero() {
		// Wall-clock time, not the store's clock: it is compared with
		// the time the NATS server stored each message.
		at = time.Now()
	}
	if err := s.deletes.Save(s.index.DB(), dev, at); err != nil {
		return out, classify(fmt.Errorf("delete device %s: record its tombstone: %w", dev, err))
	}
	out.Deleted = at
	if !ok {
		return out, fmt.Errorf("device %s: %w", dev, buckets.ErrNotFound)
	}
	defer s.watch.Removed(dev)
	// From here on the delete finishes even if its caller goes away.
	tables, removed, err := s.deleteReadings(context.WithoutCancel(ctx), dev, first, last)
	out.Tables = tables
	if err != nil {
		return out, fmt.Errorf("delete device %s: %w", dev, err)
	}
	if err := s.deleteDeviceRollups(context.WithoutCancel(ctx), dev); err != nil {
		return out, classify(fmt.Errorf("delete device %s: %w", dev, err))
	}
	if err := s.index.DeleteDevice(dev); err != nil {
		return out, classify(fmt.Errorf("delete device %s: %w", dev, err))
	}
	out.Readings = removed
	return out, nil
}

// deleteReadings removes dev's blocks from the tables of the days from
// first to last and returns how many tables held some and the readings
// they held. A device known only by its attributes (both zero) has none.
func (s *Store) deleteReadings(ctx context.Context, dev buckets.DeviceID, first, last buckets.Ticks) (int, int64, error) {
	if first == 0 && last == 0 {
		return 0, 0, nil
	}
	tables, removed := 0, int64(0)
	for _, day := range s.daysBetween(buckets.DayOf(first), buckets.DayOf(last), buckets.Asc) {
		n, had, err := s.deleteFromTable(ctx, day, dev)
		if err != nil {
			return tables, removed, err
		}
		if had {
			tables++
			removed += n
		}
	}
	return tables, removed, nil
}

// deleteFromTable removes every block of dev from the table of day and
// returns the distinct readings they held and whether there were any.
func (s *Store) deleteFromTable(ctx context.Context, day buckets.Day, dev buckets.DeviceID) (int64, bool, error) {
	t, err := s.acquire(ctx, day, forWrite)
	if errors.Is(err, errDropping) {
		return 0, false, nil // its readings go with the table
	}
	if err != nil {
		return 0, false, fmt.Errorf("table %s: %w", day, err)
	}
	defer s.release(t)
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	t.forgetDevice(dev)
	keys, n, err := deviceKeys(t, dev)
	if err != nil {
		return 0, false, fmt.Errorf("table %s: list the blocks: %w", day, err)
	}
	if len(keys) == 0 {
		return 0, false, nil
	}
	if err := s.beforeCommit(t); err != nil {
		return 0, false, classify(fmt.Errorf("table %s: %w", day, err))
	}
	for start := 0; start < len(keys); start += deleteChunkKeys {
		end := min(start+deleteChunkKeys, len(keys))
		removed := int64(0)
		if end == len(keys) {
			removed = n
		}
		if err := deleteBlockKeys(t, keys[start:end], removed); err != nil {
			return 0, false, classify(fmt.Errorf("table %s: delete the blocks: %w", day, err))
		}
	}
	return n, true, nil
}

// forgetDevice drops what the compactor and the write tracker of t know
// of dev, whose blocks are going. writeMu is held.
func (t *table) forgetDevice(dev buckets.DeviceID) {
	if n := t.comp.notes[dev]; n != nil {
		t.forget(n)
		delete(t.comp.notes, dev)
	}
	delete(t.wt.written, dev)
}

// deviceKeys lists every key under dev's prefix in t and counts the
// distinct readings of its blocks. writeMu is held.
func deviceKeys(t *table, dev buckets.DeviceID) ([][]byte, int64, error) {
	txn, done := t.ver.ReadTxn(t.db)
	defer done()
	prefix := devicePrefix(dev)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: false})
	var keys [][]byte
	var refs []blockRef
	for it.Rewind(); it.Valid(); it.Next() {
		keys = append(keys, it.Item().KeyCopy(nil))
		if ref, ok := parseBlockKey(it.Item().Key(), len(prefix)); ok {
			refs = append(refs, ref)
		}
	}
	it.Close()
	// Keys sort newest block first; blocks that overlap are neighbours.
	overlap := false
	var sum int64
	for i, r := range refs {
		sum += int64(r.count)
		if i > 0 && r.overlaps(refs[i-1]) {
			overlap = true
		}
	}
	if !overlap {
		return keys, sum, nil
	}
	seen := map[buckets.Ticks]struct{}{}
	var damaged int64
	err := eachBlock(txn, dev, 0, func(bi blockItem) (bool, error) {
		rs, err := decodeItem(bi, dev)
		if err != nil { // a damaged block: count it as its key says
			damaged += int64(bi.ref.count)
			return true, nil
		}
		for _, r := range rs {
			seen[r.Ticks] = struct{}{}
		}
		return true, nil
	})
	return keys, int64(len(seen)) + damaged, err
}

// deleteBlockKeys deletes keys from t in one transaction, lowering its
// reading count by removed. writeMu is held.
func deleteBlockKeys(t *table, keys [][]byte, removed int64) error {
	txn := t.ver.WriteTxn(t.db)
	defer txn.Discard()
	for _, k := range keys {
		if err := txn.Delete(k); err != nil {
			return err
		}
	}
	n := t.readings.Load()
	if removed > 0 && n >= 0 {
		n = max(n-removed, 0)
		if err := txn.Set(metaReadingsKey, binary.BigEndian.AppendUint64(nil, uint64(n))); err != nil {
			return err
		}
	}
	if err := t.commitTxn(txn); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if removed > 0 && n >= 0 {
		t.readings.Store(n)
	}
	return nil
}
