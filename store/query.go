package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// Reads never open a table that cannot hold the device: the device
// index bounds the days to visit, and days without a table are skipped.
// A table that cannot be opened fails the query with an error wrapping
// buckets.ErrUnavailable that names the day.

// Latest returns up to n readings of dev, newest first, across day
// tables. It stops reading as soon as it has n.
func (s *Store) Latest(ctx context.Context, dev buckets.DeviceID, n int) ([]buckets.Reading, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: latest: n %d must be positive", buckets.ErrInvalidArgument, n)
	}
	return s.collect(ctx, dev, 0, buckets.MaxTicks+1, buckets.Desc, n)
}

// Range returns the readings of q.Device with q.From <= ticks < q.To in
// q.Order, resuming strictly after *q.After when it is set, at most
// q.Limit of them; Page.More says whether more match.
func (s *Store) Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error) {
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
	rs, err := s.collect(ctx, q.Device, from, to, q.Order, q.Limit+1)
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
	first, last, ok := s.index.bounds(dev)
	if !ok || !k.Valid() || buckets.DayOf(k) < buckets.DayOf(first) || buckets.DayOf(k) > buckets.DayOf(last) {
		if err := s.Ping(ctx); err != nil {
			return buckets.Reading{}, err
		}
		return buckets.Reading{}, notFound
	}
	t, err := s.acquire(ctx, buckets.DayOf(k), forRead)
	if err != nil {
		return buckets.Reading{}, err
	}
	if t == nil {
		return buckets.Reading{}, notFound
	}
	defer s.release(t)
	r := buckets.Reading{Device: dev, Ticks: k}
	err = s.guard(t, func() error {
		txn, done := t.readTxn()
		defer done()
		item, err := txn.Get(buckets.AppendKey(nil, dev, k))
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			r.Values, err = buckets.DecodeValues(v)
			return err
		})
	})
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
		return buckets.Reading{}, notFound
	case err != nil:
		return buckets.Reading{}, classify(fmt.Errorf("get from table %s: %w", t.day, err))
	}
	return r, nil
}

// collect returns up to limit readings of dev with from <= ticks < to
// in order, visiting the day tables in the same order.
func (s *Store) collect(ctx context.Context, dev buckets.DeviceID, from, to buckets.Ticks, order buckets.Order, limit int) ([]buckets.Reading, error) {
	if err := s.Ping(ctx); err != nil {
		return nil, err
	}
	first, last, ok := s.index.bounds(dev)
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
	out := make([]buckets.Reading, 0, min(limit, 256))
	for _, d := range days {
		t, err := s.acquire(ctx, d, forRead)
		if err != nil {
			return nil, err
		}
		if t == nil {
			continue // dropped meanwhile
		}
		err = s.guard(t, func() error {
			out, err = scanTable(ctx, t, dev, max(from, d.Start()), min(to, d.End()), order, limit, out)
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
	return out, nil
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
// Row keys hold inverted ticks, so a forward iteration from the key of
// hi-1 walks newest to oldest (Desc) and a reverse iteration from the
// key of lo walks oldest to newest (Asc). Values are small and stored
// inline in the LSM tree, so prefetching them would only add work.
func scanTable(ctx context.Context, t *table, dev buckets.DeviceID, lo, hi buckets.Ticks, order buckets.Order, limit int, out []buckets.Reading) ([]buckets.Reading, error) {
	if lo >= hi {
		return out, nil
	}
	txn, done := t.readTxn()
	defer done()
	prefix := buckets.DevicePrefix(dev)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: order == buckets.Asc})
	defer it.Close()
	seek := buckets.AppendKey(nil, dev, hi-1)
	if order == buckets.Asc {
		seek = buckets.AppendKey(nil, dev, lo)
	}
	for it.Seek(seek); it.Valid() && len(out) < limit; it.Next() {
		item := it.Item()
		key := item.Key()
		if len(key) != len(prefix)+8 {
			continue // not a reading key of this device
		}
		k := buckets.TicksFromInverted(binary.BigEndian.Uint64(key[len(prefix):]))
		if k < lo || k >= hi {
			break
		}
		var fields []buckets.Field
		err := item.Value(func(v []byte) error {
			var err error
			fields, err = buckets.DecodeValues(v)
			return err
		})
		if err != nil {
			return out, fmt.Errorf("read table %s: %s %s: %w", t.day, dev, k.FormatTime(), err)
		}
		out = append(out, buckets.Reading{Device: dev, Ticks: k, Values: fields})
		if len(out)%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// guard runs a read of t, turning a Badger panic (it panics on some
// kinds of damaged data) into an error wrapping buckets.ErrUnavailable
// that names the day, logged once here.
func (s *Store) guard(t *table, read func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.metrics.tableErrors.Add(context.Background(), 1)
			s.log.Error("reading a day table failed; it may be damaged", "table", t.day.String(), "panic", firstLine(fmt.Sprint(r)))
			err = &buckets.TableError{Day: t.day, Reason: "read failed (damaged?); other days are unaffected",
				Err: errors.New(firstLine(fmt.Sprint(r)))}
		}
	}()
	return read()
}
