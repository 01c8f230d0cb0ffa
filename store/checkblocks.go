package store

import (
	"context"
	"fmt"
	"math"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
	"github.com/telemetryd/telemetryd/store/repair"
)

// CheckReport is what Check found.
type CheckReport = repair.CheckReport

// BadRecord is a device index record that failed its checksum or its
// decoding.
type BadRecord = repair.BadRecord

// Check reads and decodes every block of every day table and every
// device index record, checking each checksum, compares the attribute
// index entities with the attribute records, and reports what is
// corrupt or disagrees; found, when not nil, is called with each corrupt block as it
// is found. It changes nothing. It returns an error only when the check
// itself could not run to the end (ctx cancelled); damage is in the
// report.
func (s *Store) Check(ctx context.Context, found func(BadBlock)) (CheckReport, error) {
	var rep CheckReport
	if err := s.Ping(ctx); err != nil {
		return rep, err
	}
	for _, d := range s.daysBetween(0, math.MaxInt32, buckets.Asc) {
		t, err := s.acquire(ctx, d, forRead)
		if err != nil {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			rep.TableErrors = append(rep.TableErrors, err)
			continue
		}
		if t == nil {
			continue
		}
		rep.Tables++
		err = s.guard(t, func() error { return checkTable(ctx, t, &rep, found) })
		s.release(t)
		if err != nil {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			rep.TableErrors = append(rep.TableErrors, fmt.Errorf("table %s: %w", d, err))
		}
	}
	return rep, s.checkIndex(&rep)
}

// checkTable decodes every block of t into rep.
func checkTable(ctx context.Context, t *table, rep *CheckReport, found func(BadBlock)) error {
	txn, done := t.ver.ReadTxn(t.db)
	defer done()
	it := txn.NewIterator(badger.IteratorOptions{})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		if err := ctx.Err(); err != nil {
			return err
		}
		item := it.Item()
		if k := item.Key(); len(k) > 0 && k[0] == 0 {
			continue // table metadata
		}
		dev, ref, ok := parseAnyBlockKey(item.Key())
		var err error
		if ok {
			rep.BlocksRead++
			err = item.Value(func(v []byte) error {
				_, _, err := block.Decode(v, dev)
				return err
			})
			if err != nil && badBlockOf(&blockError{ref: ref, err: err}) == nil {
				return err // the read failed, not the block
			}
		} else {
			err = fmt.Errorf("%w: key of no known shape", block.ErrCorrupt)
		}
		if err != nil {
			bb := BadBlock{Day: t.day, Device: buckets.DeviceID(string(dev)), Key: item.KeyCopy(nil),
				Oldest: ref.oldest, Newest: ref.newest, Err: err}
			rep.Blocks = append(rep.Blocks, bb)
			if found != nil {
				found(bb)
			}
		}
	}
	return nil
}
