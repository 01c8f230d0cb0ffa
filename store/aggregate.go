package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
)

// unixEpoch is 1970-01-01T00:00:00Z in ticks: buckets are aligned to
// multiples of their width since then.
var unixEpoch = buckets.MustTicks(time.Unix(0, 0))

// Aggregate summarises the numeric values of q.Device per bucket of
// q.Interval ticks (aligned to multiples of it since the Unix epoch)
// over q.From <= ticks < q.To: per value name its count, sum, min, max,
// first and last. Buckets come oldest first, at most q.Limit of them,
// resuming behind the bucket that starts at *q.After when it is set;
// More says whether more buckets follow. Readings with the same
// (device, ticks) count once, with their merged values.
//
// A block that lies wholly inside one bucket and overlaps no other
// block of the device is summarised from its header alone; only the
// blocks at bucket edges (and overlapping ones) are decoded.
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
	agg := newAggregator(q)
	first, last, ok := s.index.bounds(q.Device)
	if ok {
		from = max(from, buckets.DayOf(first).Start())
		to = min(to, buckets.DayOf(last).End())
	}
	if !ok || from >= to {
		return agg.page(), nil
	}
	for _, d := range s.daysBetween(buckets.DayOf(from), buckets.DayOf(to-1), buckets.Asc) {
		t, err := s.acquire(ctx, d, forRead)
		if err != nil {
			return buckets.AggregatePage{}, err
		}
		if t == nil {
			continue
		}
		var done bool
		err = s.guard(t, func() error {
			done, err = agg.table(ctx, t, max(from, d.Start()), min(to, d.End()))
			return err
		})
		s.release(t)
		if err != nil {
			return buckets.AggregatePage{}, classify(fmt.Errorf("aggregate table %s: %w", d, err))
		}
		if done {
			break
		}
	}
	return agg.page(), nil
}

// aggregator accumulates the buckets of one query.
type aggregator struct {
	q        buckets.AggregateQuery
	fields   map[string]bool // nil: every name
	buckets  map[buckets.Ticks]map[string]*buckets.Summary
	headers  int           // blocks summarised from their header (for tests)
	decoded  int           // blocks decoded
	maxStart buckets.Ticks // the latest bucket start seen
}

func newAggregator(q buckets.AggregateQuery) *aggregator {
	a := &aggregator{q: q, buckets: make(map[buckets.Ticks]map[string]*buckets.Summary)}
	if len(q.Fields) > 0 {
		a.fields = make(map[string]bool, len(q.Fields))
		for _, f := range q.Fields {
			a.fields[f] = true
		}
	}
	return a
}

// bucketOf is the start of the bucket holding k.
func (a *aggregator) bucketOf(k buckets.Ticks) buckets.Ticks {
	off := (k - unixEpoch) % a.q.Interval
	if off < 0 {
		off += a.q.Interval
	}
	return k - off
}

// summary returns the summary of name in the bucket starting at start,
// or nil when the query leaves name out.
func (a *aggregator) summary(start buckets.Ticks, name string) *buckets.Summary {
	if a.fields != nil && !a.fields[name] {
		return nil
	}
	b := a.buckets[start]
	if b == nil {
		b = make(map[string]*buckets.Summary)
		a.buckets[start] = b
		a.maxStart = max(a.maxStart, start)
	}
	s := b[name]
	if s == nil {
		s = &buckets.Summary{}
		b[name] = s
	}
	return s
}

// finalBefore counts the buckets that start before start.
func (a *aggregator) finalBefore(start buckets.Ticks) int {
	if a.maxStart < start {
		return len(a.buckets)
	}
	n := 0
	for k := range a.buckets {
		if k < start {
			n++
		}
	}
	return n
}

// found is a block read for an aggregate.
type found struct {
	ref   blockRef
	value []byte
}

// table adds the readings of t in [lo, hi). done says that the page is
// complete: more than Limit buckets are final.
func (a *aggregator) table(ctx context.Context, t *table, lo, hi buckets.Ticks) (done bool, err error) {
	txn, release := t.readTxn()
	defer release()
	blocks, err := overlappingBlocks(txn, a.q.Device, lo, hi)
	if err != nil {
		return false, err
	}
	for len(blocks) > 0 {
		n, end := 1, blocks[0].ref.newest // a cluster of blocks overlapping each other
		for n < len(blocks) && blocks[n].ref.oldest <= end {
			end = max(end, blocks[n].ref.newest)
			n++
		}
		cluster := blocks[:n]
		blocks = blocks[n:]
		if a.finalBefore(a.bucketOf(max(cluster[0].ref.oldest, lo))) > a.q.Limit {
			return true, nil
		}
		r := cluster[0].ref
		if n == 1 && r.oldest >= lo && r.newest < hi && a.bucketOf(r.oldest) == a.bucketOf(r.newest) {
			if err := a.addHeader(cluster[0]); err != nil {
				return false, err
			}
			continue
		}
		if err := a.addDecoded(cluster, lo, hi); err != nil {
			return false, err
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
	}
	return false, nil
}

// overlappingBlocks returns the blocks of dev in txn that may hold
// readings in [lo, hi), by oldest reading.
func overlappingBlocks(txn *badger.Txn, dev buckets.DeviceID, lo, hi buckets.Ticks) ([]found, error) {
	var blocks []found
	err := eachBlock(txn, dev, lo, func(bi blockItem) (bool, error) {
		if bi.ref.oldest >= hi {
			return true, nil
		}
		v, err := bi.item.ValueCopy(nil)
		blocks = append(blocks, found{bi.ref, v})
		return true, err
	})
	slices.SortFunc(blocks, func(a, b found) int { return cmp.Compare(a.ref.oldest, b.ref.oldest) })
	return blocks, err
}

// addHeader adds a block that lies in one bucket from its header.
func (a *aggregator) addHeader(f found) error {
	h, err := block.ReadHeader(f.value)
	if err != nil {
		return fmt.Errorf("block %s..%s: %w", f.ref.oldest.FormatTime(), f.ref.newest.FormatTime(), err)
	}
	a.headers++
	start := a.bucketOf(h.Oldest)
	for _, in := range h.Names {
		if in.Num.Count == 0 {
			continue
		}
		if s := a.summary(start, in.Name); s != nil {
			s.Merge(in.Num)
		}
	}
	return nil
}

// addDecoded decodes a cluster of overlapping blocks and adds its
// readings in [lo, hi), each (device, ticks) once.
func (a *aggregator) addDecoded(cluster []found, lo, hi buckets.Ticks) error {
	res := newResolver()
	for _, f := range cluster {
		_, rs, err := block.Decode(f.value, a.q.Device)
		if err != nil {
			return fmt.Errorf("block %s..%s: %w", f.ref.oldest.FormatTime(), f.ref.newest.FormatTime(), err)
		}
		a.decoded++
		if len(cluster) == 1 {
			res.rs = rs // nothing to resolve
			break
		}
		res.add(rs, f.ref.seq, lo, hi)
	}
	for _, r := range res.rs {
		if r.Ticks < lo || r.Ticks >= hi {
			continue
		}
		start := a.bucketOf(r.Ticks)
		for _, f := range r.Values {
			if x, ok := buckets.Numeric(f.Value); ok {
				if s := a.summary(start, f.Name); s != nil {
					s.Add(r.Ticks, x)
				}
			}
		}
	}
	return nil
}

// page returns the first Limit buckets with numeric values, oldest
// first.
func (a *aggregator) page() buckets.AggregatePage {
	starts := make([]buckets.Ticks, 0, len(a.buckets))
	for k, b := range a.buckets {
		if len(b) > 0 {
			starts = append(starts, k)
		}
	}
	slices.Sort(starts)
	p := buckets.AggregatePage{Buckets: make([]buckets.AggregateBucket, 0, min(len(starts), a.q.Limit))}
	if len(starts) > a.q.Limit {
		starts, p.More = starts[:a.q.Limit], true
	}
	for _, k := range starts {
		b := buckets.AggregateBucket{Start: k, Values: make([]buckets.NamedSummary, 0, len(a.buckets[k]))}
		for name, s := range a.buckets[k] {
			b.Values = append(b.Values, buckets.NamedSummary{Name: name, Summary: *s})
		}
		slices.SortFunc(b.Values, func(x, y buckets.NamedSummary) int { return cmp.Compare(x.Name, y.Name) })
		p.Buckets = append(p.Buckets, b)
	}
	return p
}
