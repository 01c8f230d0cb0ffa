package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/resolve"
)

// Reads never open a table that cannot hold the device: the device
// index bounds the days to visit, and days without a table are skipped.
// A table that cannot be opened fails the query with an error wrapping
// buckets.ErrUnavailable that names the day.

// Latest returns up to n readings of dev, newest first, across day
// tables. It stops reading as soon as it has n.
func (s *Store) Latest(ctx context.Context, dev buckets.DeviceID, n int) ([]buckets.Reading, error) {
	return s.LatestIn(ctx, dev, n, nil)
}

// LatestIn is Latest building the answer in buf (buckets.ReadBuffer);
// nil buf: in new memory, as Latest.
func (s *Store) LatestIn(ctx context.Context, dev buckets.DeviceID, n int, buf *buckets.ReadBuffer) ([]buckets.Reading, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: latest: n %d must be positive", buckets.ErrInvalidArgument, n)
	}
	return s.collect(ctx, dev, 0, buckets.MaxTicks+1, buckets.Desc, n, buf)
}

// Range returns the readings of q.Device with q.From <= ticks < q.To in
// q.Order, resuming strictly after *q.After when it is set, at most
// q.Limit of them; Page.More says whether more match.
func (s *Store) Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error) {
	return s.RangeIn(ctx, q, nil)
}

// RangeIn is Range building the page in buf (buckets.ReadBuffer); nil
// buf: in new memory, as Range.
func (s *Store) RangeIn(ctx context.Context, q buckets.RangeQuery, buf *buckets.ReadBuffer) (buckets.Page, error) {
	if q.Limit <= 0 {
		return buckets.Page{}, fmt.Errorf("%w: range: limit %d must be positive", buckets.ErrInvalidArgument, q.Limit)
	}
	from, to := q.From, q.To
	if q.After != nil {
		if q.Order == buckets.Desc {
			to = min(to, *q.After)
		} else if *q.After < buckets.MaxTicks {
			from = max(from, *q.After+1)
		} else {
			to = from // nothing is after the last tick
		}
	}
	rs, err := s.collect(ctx, q.Device, from, to, q.Order, q.Limit+1, buf)
	if err != nil {
		return buckets.Page{}, err
	}
	p := buckets.Page{Readings: rs}
	if len(rs) > q.Limit {
		p.Readings, p.More = rs[:q.Limit], true
	}
	return p, nil
}

// Get returns the reading of dev at exactly k. The error wraps
// buckets.ErrNotFound when there is none.
func (s *Store) Get(ctx context.Context, dev buckets.DeviceID, k buckets.Ticks) (buckets.Reading, error) {
	if err := ctx.Err(); err != nil {
		return buckets.Reading{}, err
	}
	notFound := fmt.Errorf("reading %s at %s: %w", dev, k.FormatTime(), buckets.ErrNotFound)
	first, last, ok := s.index.Bounds(dev)
	if !ok || !k.Valid() || buckets.DayOf(k) < buckets.DayOf(first) || buckets.DayOf(k) > buckets.DayOf(last) {
		if err := s.Ping(ctx); err != nil {
			return buckets.Reading{}, err
		}
		return buckets.Reading{}, notFound
	}
	t, err := s.acquireQuery(ctx, buckets.DayOf(k))
	if err != nil {
		return buckets.Reading{}, err
	}
	if t == nil {
		return buckets.Reading{}, notFound
	}
	defer s.release(t)
	var r buckets.Reading
	var found bool
	err = s.guard(t, func() error {
		txn, done := t.ver.ReadTxn(t.db)
		defer done()
		r, found, err = getReading(ctx, t, txn, dev, k)
		return err
	})
	switch {
	case err != nil:
		return buckets.Reading{}, classify(fmt.Errorf("get from table %s: %w", t.day, err))
	case !found:
		return buckets.Reading{}, notFound
	}
	return r, nil
}

// collect returns up to limit readings of dev with from <= ticks < to
// in order, visiting the day tables in the same order, built in buf
// when it is not nil.
func (s *Store) collect(ctx context.Context, dev buckets.DeviceID, from, to buckets.Ticks, order buckets.Order, limit int, buf *buckets.ReadBuffer) ([]buckets.Reading, error) {
	if err := s.Ping(ctx); err != nil {
		return nil, err
	}
	first, last, ok := s.index.Bounds(dev)
	if !ok {
		return []buckets.Reading{}, nil
	}
	// Only the first and last *days* of the index are durable at every
	// commit (exact ticks are saved periodically, so after a crash they
	// can lag the tables): bound by whole days.
	from = max(from, buckets.DayOf(first).Start(), 0)
	to = min(to, buckets.DayOf(last).End(), buckets.MaxTicks+1)
	if from >= to {
		return []buckets.Reading{}, nil
	}
	days := s.daysBetween(buckets.DayOf(from), buckets.DayOf(to-1), order)
	out, vals := answerIn(buf, limit)
	for _, d := range days {
		t, err := s.acquireQuery(ctx, d)
		if err != nil {
			return nil, err
		}
		if t == nil {
			continue // dropped meanwhile
		}
		err = s.guard(t, func() error {
			out, err = scanTable(ctx, t, dev, max(from, d.Start()), min(to, d.End()), order, limit, out, vals)
			return err
		})
		s.release(t)
		if err != nil {
			return nil, err
		}
		if len(out) >= limit {
			break
		}
	}
	if buf != nil {
		buf.Readings, buf.Values = out, *vals
	}
	return out, nil
}

// answerIn returns the storage of an answer of up to limit readings:
// buf's, or new memory (and no value storage) when buf is nil.
func answerIn(buf *buckets.ReadBuffer, limit int) ([]buckets.Reading, *[]buckets.Field) {
	if buf == nil {
		return make([]buckets.Reading, 0, min(limit, 256)), nil
	}
	vals := buf.Values[:0]
	return buf.Readings[:0], &vals
}

// daysBetween lists the days in [lo, hi] that have a table, in order.
func (s *Store) daysBetween(lo, hi buckets.Day, order buckets.Order) []buckets.Day {
	s.mu.Lock()
	days := make([]buckets.Day, 0, min(int64(hi)-int64(lo)+1, int64(len(s.tables))))
	for d, t := range s.tables {
		if d >= lo && d <= hi && !t.dropping {
			days = append(days, d)
		}
	}
	s.mu.Unlock()
	slices.Sort(days)
	if order == buckets.Desc {
		slices.Reverse(days)
	}
	return days
}

// scanTable appends to out the readings of dev in t with lo <= ticks <
// hi, in order, until out holds limit readings.
//
// Keys sort a device's blocks newest first. Newest first (Desc), a
// reading newer than the newest reading of every block not yet read is
// final, so the scan stops as soon as limit readings are final. Oldest
// first (Asc), the blocks that may hold readings of the range are
// gathered (their keys say which) and read by their oldest reading.
func scanTable(ctx context.Context, t *table, dev buckets.DeviceID, lo, hi buckets.Ticks, order buckets.Order, limit int, out []buckets.Reading, vals *[]buckets.Field) ([]buckets.Reading, error) {
	if lo >= hi || len(out) >= limit {
		return out, nil
	}
	txn, done := t.ver.ReadTxn(t.db)
	defer done()
	res := resolve.New()
	var err error
	if order == buckets.Desc {
		err = eachBlock(txn, dev, lo, func(bi blockItem) (bool, error) {
			if bi.ref.oldest >= hi {
				return true, nil
			}
			if out = res.AppendTake(out, order, bi.ref.newest); len(out) >= limit {
				return false, nil
			}
			// Only the newest limit-len(out) readings of the block can
			// be among the answer's: any older one has that many newer
			// ones in this block alone.
			rs, err := readItem(bi, dev, lo, hi, limit-len(out), true, vals)
			if t.bad.skip(ctx, t.day, dev, err) {
				return true, ctx.Err()
			}
			if err != nil {
				return false, err
			}
			res.Add(rs, bi.ref.seq, lo, hi)
			return true, ctx.Err()
		})
		if len(out) < limit {
			out = res.AppendTake(out, order, lo-1)
		}
	} else {
		out, err = scanAsc(ctx, t, txn, dev, lo, hi, limit, out, res, vals)
	}
	if err != nil {
		return out, fmt.Errorf("read table %s: %s: %w", t.day, dev, err)
	}
	return out[:min(len(out), limit)], nil
}

// scanAsc is the oldest-first half of scanTable.
func scanAsc(ctx context.Context, t *table, txn *badger.Txn, dev buckets.DeviceID, lo, hi buckets.Ticks, limit int, out []buckets.Reading, res *resolve.Resolver, vals *[]buckets.Field) ([]buckets.Reading, error) {
	type found struct {
		ref   blockRef
		value []byte
	}
	var blocks []found
	err := eachBlock(txn, dev, lo, func(bi blockItem) (bool, error) {
		if bi.ref.oldest >= hi {
			return true, nil
		}
		v, err := bi.item.ValueCopy(nil)
		blocks = append(blocks, found{bi.ref, v})
		return true, err
	})
	if err != nil {
		return out, err
	}
	slices.SortFunc(blocks, func(a, b found) int { return cmp.Compare(a.ref.oldest, b.ref.oldest) })
	// Room for what the blocks are expected to give, in one allocation.
	expect := 0
	for _, b := range blocks {
		expect += rowsIn(b.ref, lo, hi)
	}
	out = slices.Grow(out, min(expect, limit-len(out)))
	for _, b := range blocks {
		if out = res.AppendTake(out, buckets.Asc, b.ref.oldest); len(out) >= limit {
			return out, nil
		}
		rs, err := readBlock(b.value, dev, lo, hi, limit-len(out), false, vals)
		if err != nil {
			err = &blockError{ref: b.ref, err: err}
			if !t.bad.skip(ctx, t.day, dev, err) {
				return out, err
			}
			continue
		}
		res.Add(rs, b.ref.seq, lo, hi)
		if err := ctx.Err(); err != nil {
			return out, err
		}
	}
	return res.AppendTake(out, buckets.Asc, hi), nil
}

// rowsIn estimates how many readings of the block ref lie in [lo, hi),
// erring high: all of them when the block lies inside, else its count
// in proportion to the part of its time span inside, plus one.
func rowsIn(ref blockRef, lo, hi buckets.Ticks) int {
	if ref.oldest >= lo && ref.newest < hi {
		return ref.count
	}
	first, last := max(ref.oldest, lo), min(ref.newest, hi-1)
	if first > last {
		return 0
	}
	span := float64(ref.newest-ref.oldest) + 1
	return min(ref.count, int(float64(ref.count)*(float64(last-first)+1)/span)+1)
}

// getReading returns the reading of dev at k in txn, a transaction of
// t; ok is false when there is none. Corrupt blocks are skipped.
func getReading(ctx context.Context, t *table, txn *badger.Txn, dev buckets.DeviceID, k buckets.Ticks) (r buckets.Reading, ok bool, err error) {
	var best uint64
	err = eachBlock(txn, dev, k, func(bi blockItem) (bool, error) {
		if bi.ref.oldest > k || (ok && bi.ref.seq < best) {
			return true, nil
		}
		rs, err := readItem(bi, dev, k, k+1, 1, true, nil)
		if t.bad.skip(ctx, t.day, dev, err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if len(rs) == 1 {
			r, ok, best = rs[0], true, bi.ref.seq
		}
		return true, nil
	})
	return r, ok, err
}
