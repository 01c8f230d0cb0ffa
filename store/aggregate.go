package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

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
	buckets  map[buckets.Ticks]*aggBucket
	headers  int               // blocks summarised from their header (for tests)
	decoded  int               // blocks decoded
	maxStart buckets.Ticks     // the latest bucket start seen
	names    map[string]string // interned value names
}

// aggBucket is one bucket being summed: few names, so a slice.
type aggBucket struct {
	names []string
	sums  []buckets.Summary
}

func newAggregator(q buckets.AggregateQuery) *aggregator {
	a := &aggregator{q: q, buckets: make(map[buckets.Ticks]*aggBucket), names: make(map[string]string)}
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
// or nil when the query leaves name out. name may be a byte slice
// converted in the call: it is copied only when first seen.
func (a *aggregator) summary(start buckets.Ticks, name []byte) *buckets.Summary {
	if a.fields != nil && !a.fields[string(name)] {
		return nil
	}
	b := a.buckets[start]
	if b == nil {
		b = &aggBucket{names: make([]string, 0, 4), sums: make([]buckets.Summary, 0, 4)}
		a.buckets[start] = b
		a.maxStart = max(a.maxStart, start)
	}
	for i, n := range b.names {
		if n == string(name) {
			return &b.sums[i]
		}
	}
	interned, ok := a.names[string(name)]
	if !ok {
		interned = string(name)
		a.names[interned] = interned
	}
	b.names = append(b.names, interned)
	b.sums = append(b.sums, buckets.Summary{})
	return &b.sums[len(b.sums)-1]
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

// table adds the readings of t in [lo, hi). done says that the page is
// complete: more than Limit buckets are final.
//
// A first pass over the keys finds the blocks and which of them lie
// alone in one bucket; a second pass reads those from their headers in
// place and decodes the others, each group of overlapping blocks
// resolved together.
func (a *aggregator) table(ctx context.Context, t *table, lo, hi buckets.Ticks) (done bool, err error) {
	if a.finalBefore(a.bucketOf(lo)) > a.q.Limit {
		return true, nil
	}
	txn, release := t.readTxn()
	defer release()
	var refs []blockRef
	err = eachBlock(txn, a.q.Device, lo, func(bi blockItem) (bool, error) {
		if bi.ref.oldest < hi {
			refs = append(refs, bi.ref)
		}
		return true, nil
	})
	if err != nil || len(refs) == 0 {
		return false, err
	}
	group := a.groups(refs, lo, hi)
	res := make(map[int]*resolver)
	err = eachBlock(txn, a.q.Device, lo, func(bi blockItem) (bool, error) {
		g, ok := group[bi.ref]
		if !ok {
			return true, nil
		}
		return true, bi.item.Value(func(v []byte) error {
			if g < 0 {
				return a.addHeader(bi.ref, v)
			}
			_, rs, err := block.Decode(v, a.q.Device)
			if err != nil {
				return fmt.Errorf("block %s..%s: %w", bi.ref.oldest.FormatTime(), bi.ref.newest.FormatTime(), err)
			}
			a.decoded++
			if res[g] == nil {
				res[g] = newResolver()
			}
			res[g].add(rs, bi.ref.seq, lo, hi)
			return ctx.Err()
		})
	})
	for _, r := range res {
		a.addReadings(r.rs)
	}
	return false, err
}

// groups maps each block of refs to the group of blocks overlapping
// it, or to -1 when it overlaps none and lies in one bucket inside
// [lo, hi), so that its header is enough.
func (a *aggregator) groups(refs []blockRef, lo, hi buckets.Ticks) map[blockRef]int {
	slices.SortFunc(refs, func(x, y blockRef) int { return cmp.Compare(x.oldest, y.oldest) })
	group := make(map[blockRef]int, len(refs))
	for i := 0; i < len(refs); {
		n, end := 1, refs[i].newest
		for i+n < len(refs) && refs[i+n].oldest <= end {
			end = max(end, refs[i+n].newest)
			n++
		}
		r := refs[i]
		whole := n == 1 && r.oldest >= lo && r.newest < hi && a.bucketOf(r.oldest) == a.bucketOf(r.newest)
		for _, x := range refs[i : i+n] {
			group[x] = i
			if whole {
				group[x] = -1
			}
		}
		i += n
	}
	return group
}

// addHeader adds a block that lies in one bucket from its header.
func (a *aggregator) addHeader(ref blockRef, v []byte) error {
	start := a.bucketOf(ref.oldest)
	_, _, err := block.EachSummary(v, func(name []byte, sum buckets.Summary) {
		if s := a.summary(start, name); s != nil {
			s.Merge(sum)
		}
	})
	if err != nil {
		return fmt.Errorf("block %s..%s: %w", ref.oldest.FormatTime(), ref.newest.FormatTime(), err)
	}
	a.headers++
	return nil
}

// addReadings adds resolved readings, each (device, ticks) once.
func (a *aggregator) addReadings(rs []buckets.Reading) {
	for _, r := range rs {
		start := a.bucketOf(r.Ticks)
		for _, f := range r.Values {
			if x, ok := buckets.Numeric(f.Value); ok {
				if s := a.summary(start, []byte(f.Name)); s != nil {
					s.Add(r.Ticks, x)
				}
			}
		}
	}
}

// page returns the first Limit buckets with numeric values, oldest
// first.
func (a *aggregator) page() buckets.AggregatePage {
	starts := make([]buckets.Ticks, 0, len(a.buckets))
	for k, b := range a.buckets {
		if len(b.names) > 0 {
			starts = append(starts, k)
		}
	}
	slices.Sort(starts)
	p := buckets.AggregatePage{Buckets: make([]buckets.AggregateBucket, 0, min(len(starts), a.q.Limit))}
	if len(starts) > a.q.Limit {
		starts, p.More = starts[:a.q.Limit], true
	}
	for _, k := range starts {
		ab := a.buckets[k]
		b := buckets.AggregateBucket{Start: k, Values: make([]buckets.NamedSummary, len(ab.names))}
		for i, name := range ab.names {
			b.Values[i] = buckets.NamedSummary{Name: name, Summary: ab.sums[i]}
		}
		slices.SortFunc(b.Values, func(x, y buckets.NamedSummary) int { return cmp.Compare(x.Name, y.Name) })
		p.Buckets = append(p.Buckets, b)
	}
	return p
}
