package store

import (
	"context"
	"fmt"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/aggregate"
	"github.com/telemetryd/telemetryd/store/resolve"
)

// Aggregate summarises the numeric values of q.Device per bucket of
// q.Interval ticks (aligned to multiples of it since the Unix epoch)
// over q.From <= ticks < q.To: per value name its count, sum, min, max,
// first and last. Buckets come oldest first, at most q.Limit of them,
// resuming behind the bucket that starts at *q.After when it is set;
// More says whether more buckets follow. Readings with the same
// (device, ticks) count once, with their merged values.
//
// A block that lies wholly inside one bucket and overlaps no other
// block of the device is summarised from its header alone (per
// millisecond, only when the block says no two of its readings share
// one); blocks cut by bucket edges have only their time column and the
// wanted values' columns read; only blocks that overlap others are
// decoded into readings.
func (s *Store) Aggregate(ctx context.Context, q buckets.AggregateQuery) (buckets.AggregatePage, error) {
	if q.Interval < buckets.TicksPerSecond {
		return buckets.AggregatePage{}, fmt.Errorf("%w: aggregate: interval of %d ticks is less than one second", buckets.ErrInvalidArgument, q.Interval)
	}
	if q.Limit <= 0 {
		return buckets.AggregatePage{}, fmt.Errorf("%w: aggregate: limit %d must be positive", buckets.ErrInvalidArgument, q.Limit)
	}
	if err := s.Ping(ctx); err != nil {
		return buckets.AggregatePage{}, err
	}
	from, to := max(q.From, 0), min(q.To, buckets.MaxTicks+1)
	if q.After != nil {
		if *q.After > buckets.MaxTicks-q.Interval {
			return buckets.AggregatePage{Buckets: []buckets.AggregateBucket{}}, nil
		}
		from = max(from, *q.After+q.Interval)
	}
	if s.rollupsOn() {
		if p, ok, err := s.rollups.set.Aggregate(ctx, rollTables{s}, q, from, to); ok || err != nil {
			return p, err
		}
	}
	first, last, ok := s.index.Bounds(q.Device)
	if ok {
		from = max(from, buckets.DayOf(first).Start())
		to = min(to, buckets.DayOf(last).End())
	}
	if !ok || from >= to {
		return aggregate.New(q, 0).Page(), nil
	}
	agg := aggregate.New(q, int(min(int64((to-from)/q.Interval)+1, int64(q.Limit)+1, aggregate.MaxBucketsHint)))
	agg.Span(from, to)
	agg.UseCache(s.cols)
	defer agg.Release()
	for _, d := range s.daysBetween(buckets.DayOf(from), buckets.DayOf(to-1), buckets.Asc) {
		done, err := s.aggregateDay(ctx, agg, d, max(from, d.Start()), min(to, d.End()))
		if err != nil {
			return buckets.AggregatePage{}, err
		}
		if done {
			break
		}
	}
	return agg.Page(), nil
}

// aggregateDay adds the readings of the table of d in [lo, hi) to agg;
// done says that the page is complete.
func (s *Store) aggregateDay(ctx context.Context, agg *aggregate.Aggregator, d buckets.Day, lo, hi buckets.Ticks) (done bool, err error) {
	t, err := s.acquireQuery(ctx, d)
	if err != nil || t == nil {
		return false, err
	}
	err = s.guard(t, func() error {
		done, err = aggregateTable(ctx, agg, t, lo, hi)
		return err
	})
	s.release(t)
	if err != nil {
		return false, classify(fmt.Errorf("aggregate table %s: %w", d, err))
	}
	return done, nil
}

// ticksPerMs is the ticks of one millisecond; the Unix epoch is a
// multiple of it, so k / ticksPerMs numbers the milliseconds.
const ticksPerMs = buckets.TicksPerSecond / 1000

// aggregateTable adds the readings of t in [lo, hi) to agg
// (aggregate.Aggregator.Table).
func aggregateTable(ctx context.Context, agg *aggregate.Aggregator, t *table, lo, hi buckets.Ticks) (done bool, err error) {
	at := &aggTable{t: t, dev: agg.Device()}
	defer at.close()
	return agg.Table(ctx, at, lo, hi)
}

// aggTable is a day table as aggregate.Table: its read transaction and
// block iterator, both opened on first use.
type aggTable struct {
	t       *table
	dev     buckets.DeviceID
	txn     *badger.Txn
	release func()
	it      blockIterator // valid when open
	open    bool
}

var _ aggregate.Table = (*aggTable)(nil)

// readTxn is the table's read transaction.
func (at *aggTable) readTxn() *badger.Txn {
	if at.txn == nil {
		at.txn, at.release = at.t.ver.ReadTxn(at.t.db)
	}
	return at.txn
}

// close closes the iterator and ends the transaction.
func (at *aggTable) close() {
	if at.open {
		at.it.Close()
	}
	if at.release != nil {
		at.release()
	}
}

func (at *aggTable) Gen() uint64    { return at.t.gen }
func (at *aggTable) ReadTs() uint64 { return at.readTxn().ReadTs() }

// Blocks walks the device's blocks with one iterator for every pass.
func (at *aggTable) Blocks(lo buckets.Ticks, fn func(aggregate.Block) (bool, error)) error {
	if !at.open {
		at.it, at.open = newBlockIterator(at.readTxn(), at.dev), true
	}
	return at.it.each(lo, func(bi blockItem) (bool, error) {
		return fn(aggregate.Block{Ref: aggRef(bi.ref), Distinct: bi.item.UserMeta()&metaDistinctMs != 0, Item: bi.item})
	})
}

// Value reads the block's bytes and reports what fails as a blockError.
func (at *aggTable) Value(b aggregate.Block, fn func(v []byte) error) error {
	return b.Item.Value(func(v []byte) error {
		if err := fn(v); err != nil {
			return &blockError{ref: refOf(b.Ref), err: err}
		}
		return nil
	})
}

func (at *aggTable) Skip(ctx context.Context, err error) bool {
	return at.t.bad.skip(ctx, at.t.day, at.dev, err)
}

func (at *aggTable) Resolver() aggregate.Resolver { return resolve.New() }

// aggRef is ref as aggregate.Ref, and refOf the way back.
func aggRef(ref blockRef) aggregate.Ref {
	return aggregate.Ref{Newest: ref.newest, Oldest: ref.oldest, Seq: ref.seq, Count: ref.count, Sealed: ref.sealed}
}

func refOf(ref aggregate.Ref) blockRef {
	return blockRef{newest: ref.Newest, oldest: ref.Oldest, seq: ref.Seq, count: ref.Count, sealed: ref.Sealed}
}
