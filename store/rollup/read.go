package rollup

import (
	"context"
	"errors"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/aggregate"
)

// Tables is what an aggregate read partly from the rollups needs of the
// day tables, which answer what the rollups do not hold yet.
type Tables interface {
	// DaySpan is the span of the days that have a day table:
	// (buckets.MaxTicks+1, -1) when there is none.
	DaySpan() (lo, hi buckets.Ticks)
	// Has reports whether the table of d exists and is not being
	// dropped.
	Has(d buckets.Day) bool
	// Aggregate adds [lo, hi) of the table of d to agg; done says agg
	// holds a complete page.
	Aggregate(ctx context.Context, agg *aggregate.Aggregator, d buckets.Day, lo, hi buckets.Ticks) (done bool, err error)
	// Classify marks transient storage errors, as the store's reads do.
	Classify(err error) error
}

// errPageDone stops a rollup scan once the page is complete.
var errPageDone = errors.New("page complete")

// Aggregate answers q over [from, to) from the rollups where it
// can: the level with the largest interval that divides q.Interval
// answers, per day, the whole buckets of that level before the
// device's mark (all of them once the day table is gone); the day
// table answers the rest. A bucket of the level whose readings share a
// millisecond is read from the day table for a per-millisecond query
// while the table is there. ok is false when no level divides
// q.Interval: the caller reads the day tables alone.
//
// Without the day table, the parts of the range that are not whole
// buckets of the level (an unaligned from or to) have no answer.
func (s *Set) Aggregate(ctx context.Context, tables Tables, q buckets.AggregateQuery, from, to buckets.Ticks) (buckets.AggregatePage, bool, error) {
	levels := s.Levels()
	lvl, ok := For(levels, q.Interval)
	if !ok {
		return buckets.AggregatePage{}, false, nil
	}
	iv := buckets.Ticks(levels[lvl].Interval / 100)
	from, to, any := s.dataSpan(tables, from, to)
	n := max(min(int64((to-from)/q.Interval)+1, int64(q.Limit)+1), 0) // the most buckets of the answer
	r := &rollRead{s: s, tables: tables, ctx: ctx, q: q, level: lvl, iv: iv, pendLo: -1, last: buckets.DayOf(to - 1)}
	if q.Interval == iv && any {
		// The rollups answer as they are (direct) but for the parts of
		// the day tables past the marks: the answer is sized once.
		r.direct = make([]buckets.AggregateBucket, 0, n)
		n = min(n, directAggHint)
	}
	agg := aggregate.New(q, int(min(n, aggregate.MaxBucketsHint)))
	defer agg.Release()
	r.agg = agg
	if !any {
		return agg.Page(), true, nil
	}
	for d := buckets.DayOf(from); d <= buckets.DayOf(to-1); d++ {
		if err := r.day(d, max(from, d.Start()), min(to, d.End())); err != nil {
			return buckets.AggregatePage{}, true, err
		}
		if r.done || agg.FinalBefore(agg.BucketOf(d.End()))+len(r.direct) > q.Limit {
			break
		}
	}
	if err := r.flush(); err != nil {
		return buckets.AggregatePage{}, true, err
	}
	return r.page(), true, nil
}

// directAggHint is the room for buckets the aggregator of a query
// answered mostly by rollups as they are makes before it sees them.
const directAggHint = 64

// dataSpan narrows [from, to) to the days of the day tables and the
// months of the rollups; any is false when nothing is left.
func (s *Set) dataSpan(tables Tables, from, to buckets.Ticks) (lo, hi buckets.Ticks, any bool) {
	lo, hi = tables.DaySpan()
	if rlo, rhi, ok := s.Span(); ok {
		lo, hi = min(lo, rlo), max(hi, rhi)
	}
	lo, hi = max(lo, from), min(hi, to)
	return lo, hi, lo < hi
}

// rollRead is one aggregate query read partly from rollups. Contiguous
// ranges answered by the rollups are gathered (pendLo, pendHi) and read
// with one scan.
type rollRead struct {
	s      *Set
	tables Tables
	ctx    context.Context
	q      buckets.AggregateQuery
	agg    *aggregate.Aggregator
	level  int
	iv     buckets.Ticks
	pendLo buckets.Ticks // -1: nothing pending
	pendHi buckets.Ticks
	done   bool
	last   buckets.Day // the query's last day
	// marks are the device's marks of the level from marksFrom to
	// last, read when the first day with a table needs its mark.
	marks     []buckets.Ticks
	marksFrom buckets.Day
	// direct holds, when the query's interval is the level's, the
	// buckets the rollups answer, oldest first: each is one answer
	// bucket as it is, so it skips the aggregator.
	direct []buckets.AggregateBucket
}

// add keeps b, which holds only the names the query asks for (the scan
// left out the others), as an answer bucket.
func (r *rollRead) add(b Bucket) {
	r.direct = append(r.direct, buckets.AggregateBucket{Start: b.Start, Values: b.Values})
}

// page is the answer: the aggregator's buckets and the direct ones
// (never the same bucket), oldest first, at most Limit of them.
func (r *rollRead) page() buckets.AggregatePage {
	if r.agg.Len() == 0 && len(r.direct) > 0 { // the answer as the rollups gave it
		p := buckets.AggregatePage{Buckets: r.direct, More: r.done}
		if len(p.Buckets) > r.q.Limit {
			p.Buckets, p.More = p.Buckets[:r.q.Limit], true
		}
		return p
	}
	p := r.agg.Page()
	if len(r.direct) == 0 {
		return p
	}
	all := make([]buckets.AggregateBucket, 0, min(len(p.Buckets)+len(r.direct), r.q.Limit+1))
	i, j := 0, 0
	for len(all) <= r.q.Limit && (i < len(p.Buckets) || j < len(r.direct)) {
		if j >= len(r.direct) || i < len(p.Buckets) && p.Buckets[i].Start < r.direct[j].Start {
			all = append(all, p.Buckets[i])
			i++
		} else {
			all = append(all, r.direct[j])
			j++
		}
	}
	more := p.More || r.done
	if len(all) > r.q.Limit {
		all, more = all[:r.q.Limit], true
	}
	return buckets.AggregatePage{Buckets: all, More: more}
}

// mark returns the device's mark of the level for d, a day not before
// the days asked before.
func (r *rollRead) mark(d buckets.Day) (buckets.Ticks, error) {
	if r.marks == nil {
		ms, err := r.s.Marks(r.level, r.q.Device, d, max(d, r.last))
		if err != nil {
			return -1, err
		}
		r.marks, r.marksFrom = ms, d
	}
	return r.marks[d-r.marksFrom], nil
}

// day reads [lo, hi) of day d.
func (r *rollRead) day(d buckets.Day, lo, hi buckets.Ticks) error {
	a, b := ceilTo(lo, r.iv), hi-hi%r.iv // whole buckets of the level
	raw := r.tables.Has(d)
	if raw {
		mark, err := r.mark(d)
		if err != nil {
			return err
		}
		b = min(b, mark-mark%r.iv)
	}
	if a >= b {
		if !raw {
			return nil
		}
		return r.raw(d, lo, hi)
	}
	// A table read merges a day's blocks newest first: the part past the
	// mark, then the rollups, then the part before the first whole bucket.
	if raw && b < hi {
		if err := r.raw(d, b, hi); err != nil {
			return err
		}
	}
	if r.pendLo >= 0 && r.pendHi != a {
		if err := r.flush(); err != nil {
			return err
		}
	}
	if r.pendLo < 0 {
		r.pendLo = a
	}
	r.pendHi = b
	if raw && (lo < a || b < hi) {
		if err := r.flush(); err != nil {
			return err
		}
	}
	if raw && lo < a {
		return r.raw(d, lo, a)
	}
	return nil
}

// raw reads [lo, hi) of the table of d, after what is pending.
func (r *rollRead) raw(d buckets.Day, lo, hi buckets.Ticks) error {
	if err := r.flush(); err != nil || r.done {
		return err
	}
	done, err := r.tables.Aggregate(r.ctx, r.agg, d, lo, hi)
	r.done = r.done || done
	return err
}

// flush reads the pending range from the rollups.
func (r *rollRead) flush() error {
	if r.pendLo < 0 || r.done {
		r.pendLo = -1
		return nil
	}
	lo, hi := r.pendLo, r.pendHi
	r.pendLo = -1
	var fromTable []buckets.Ticks // buckets the day table answers
	var group []Bucket            // of one answer bucket and day
	err := r.s.ScanNames(r.ctx, r.level, r.q.Device, lo, hi, r.agg.Fields(), func(b Bucket) error {
		if r.agg.Unslotted()+len(r.direct) > r.q.Limit && r.agg.FinalBefore(b.Start)+len(r.direct) > r.q.Limit {
			return errPageDone
		}
		if r.q.PerMillisecond && !b.DistinctMs && r.tables.Has(buckets.DayOf(b.Start)) {
			fromTable = append(fromTable, b.Start)
			return nil
		}
		if r.q.Interval == r.iv {
			r.add(b)
			return nil
		}
		if len(group) > 0 && (r.agg.BucketOf(b.Start) != r.agg.BucketOf(group[0].Start) || buckets.DayOf(b.Start) != buckets.DayOf(group[0].Start)) {
			r.merge(group)
			group = group[:0]
		}
		group = append(group, b)
		return nil
	})
	if errors.Is(err, errPageDone) {
		r.done, err = true, nil
	}
	if err != nil {
		return r.tables.Classify(err)
	}
	r.merge(group)
	for _, k := range fromTable {
		if _, err := r.tables.Aggregate(r.ctx, r.agg, buckets.DayOf(k), k, k+r.iv); err != nil {
			return err
		}
	}
	return nil
}

// ceilTo rounds k up to a multiple of iv.
func ceilTo(k, iv buckets.Ticks) buckets.Ticks {
	if m := k % iv; m != 0 {
		return k + iv - m
	}
	return k
}

// merge adds group, the rollup buckets of one answer bucket and one
// day (oldest first), newest first: the order in which a day table
// read merges the summaries of its blocks, so that a sum over whole
// hourly blocks adds up in the same order.
func (r *rollRead) merge(group []Bucket) {
	for i := len(group) - 1; i >= 0; i-- {
		b := group[i]
		start := r.agg.BucketOf(b.Start)
		for _, v := range b.Values {
			if s := r.agg.Summary(start, []byte(v.Name)); s != nil {
				s.Merge(v.Summary)
			}
		}
	}
}
