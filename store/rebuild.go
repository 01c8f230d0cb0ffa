package store

import (
	"context"
	"fmt"
	"math"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/devindex"
	"github.com/telemetryd/telemetryd/store/resolve"
	"github.com/telemetryd/telemetryd/store/versions"
)

// rebuildIndex fills an empty device index from the day tables, for a
// data directory whose index directory was lost, or one with records
// that failed their checksum. Queries rely on the
// index to know which days hold a device, so without it they would
// find nothing. It reads every table once, oldest first, through the
// normal open/close lifecycle, so memory stays bounded; damaged tables
// are skipped (their failure is logged where they fail to open).
func (s *Store) rebuildIndex(ctx context.Context) error {
	days := s.daysBetween(0, math.MaxInt32, buckets.Asc)
	if len(days) == 0 || (s.index.Len() > 0 && len(s.index.Damaged()) == 0) {
		return nil
	}
	s.log.Warn("device index is empty or has corrupt records; rebuilding it from the day tables",
		"tables", len(days), "corrupt_records", len(s.index.Damaged()))
	var readings int
	for _, d := range days {
		t, err := s.acquire(ctx, d, forRead)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		if t == nil {
			continue
		}
		var n int
		err = s.guard(t, func() error {
			n, err = indexTable(t, s.index)
			return err
		})
		s.release(t)
		if err != nil {
			return fmt.Errorf("rebuild device index from table %s: %w", d, err)
		}
		readings += n
	}
	if err := s.index.Flush(); err != nil {
		return fmt.Errorf("rebuild device index: %w", err)
	}
	s.log.Warn("device index rebuilt", "devices", s.index.Len(), "readings", readings)
	return nil
}

// indexTable feeds every reading of db to the index, one device at a
// time (the blocks of a device are adjacent and resolved together).
// Corrupt blocks are skipped.
func indexTable(t *table, idx *devindex.Index) (int, error) {
	n := 0
	var dev buckets.DeviceID
	res := resolve.New()
	flush := func() {
		rs := res.Take(buckets.Asc, buckets.MaxTicks+1)
		idx.Observe(rs)
		n += len(rs)
	}
	err := versions.ViewLatest(t.db, func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			if k := item.Key(); len(k) > 0 && k[0] == 0 {
				continue // table metadata
			}
			d, ref, ok := parseAnyBlockKey(item.Key())
			if !ok {
				return fmt.Errorf("unexpected key %x", item.Key())
			}
			if d != dev {
				flush()
				dev = buckets.DeviceID(string(d))
			}
			rs, err := decodeItem(blockItem{ref: ref, item: item}, dev)
			if t.bad.skip(context.Background(), t.day, dev, err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("%s: %w", dev, err)
			}
			res.Add(rs, ref.seq, 0, buckets.MaxTicks+1)
		}
		return nil
	})
	flush()
	return n, err
}
