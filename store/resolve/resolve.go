// Package resolve merges the readings of a device's blocks read from a
// day table: where blocks overlap (a late or repeated reading), for
// each ticks the reading of the block with the highest sequence wins,
// and the winners are handed out in time order.
package resolve

import (
	"cmp"
	"slices"

	"github.com/telemetryd/telemetryd/buckets"
)

// Resolver merges the readings of overlapping blocks: for each ticks
// the reading of the block with the highest sequence wins. Until a
// block overlaps the readings it holds (the common case: sealed blocks
// never overlap) it keeps no index and adding a block is an append.
type Resolver struct {
	at     map[buckets.Ticks]int // ticks -> index in rs; nil until blocks overlap
	rs     []buckets.Reading
	sq     []uint64      // sequence of the block each reading came from
	lo, hi buckets.Ticks // oldest and newest ticks in rs, when it is not empty
}

// New returns an empty resolver.
func New() *Resolver { return &Resolver{} }

// Add takes the readings (oldest first, as blocks hold them) of a
// block with sequence seq that lie in [lo, hi). rs becomes the
// resolver's: the caller must not use it afterwards.
func (r *Resolver) Add(rs []buckets.Reading, seq uint64, lo, hi buckets.Ticks) {
	i0, _ := slices.BinarySearchFunc(rs, lo, byTicks)
	i1, _ := slices.BinarySearchFunc(rs, hi, byTicks)
	if rs = rs[i0:max(i0, i1)]; len(rs) == 0 {
		return
	}
	first, last := rs[0].Ticks, rs[len(rs)-1].Ticks
	if r.at == nil && len(r.rs) == 0 {
		// The common case (blocks that overlap none read before): the
		// resolver takes rs over instead of copying it.
		r.lo, r.hi, r.rs = first, last, rs
		r.sq = slices.Grow(r.sq[:0], len(rs))
		for range rs {
			r.sq = append(r.sq, seq)
		}
		return
	}
	if r.at == nil && (last < r.lo || first > r.hi) {
		r.lo, r.hi = min(r.lo, first), max(r.hi, last)
		r.rs = append(r.rs, rs...)
		for range rs {
			r.sq = append(r.sq, seq)
		}
		return
	}
	if r.at == nil {
		r.at = make(map[buckets.Ticks]int, len(r.rs)+len(rs))
		for i, x := range r.rs {
			r.at[x.Ticks] = i
		}
	}
	r.lo, r.hi = min(r.lo, first), max(r.hi, last)
	for _, x := range rs {
		if i, ok := r.at[x.Ticks]; ok {
			if seq > r.sq[i] {
				r.rs[i], r.sq[i] = x, seq
			}
			continue
		}
		r.at[x.Ticks] = len(r.rs)
		r.rs = append(r.rs, x)
		r.sq = append(r.sq, seq)
	}
}

// Readings are the readings that won so far, each ticks once, in no
// particular order. They stay the resolver's.
func (r *Resolver) Readings() []buckets.Reading { return r.rs }

// byTicks compares a reading's ticks with k.
func byTicks(x buckets.Reading, k buckets.Ticks) int { return cmp.Compare(x.Ticks, k) }

// Take removes and returns, sorted in order, the readings with ticks
// above bound (Desc) or below it (Asc).
func (r *Resolver) Take(order buckets.Order, bound buckets.Ticks) []buckets.Reading {
	return r.AppendTake(nil, order, bound)
}

// AppendTake is Take appending to dst.
func (r *Resolver) AppendTake(dst []buckets.Reading, order buckets.Order, bound buckets.Ticks) []buckets.Reading {
	start := len(dst)
	if free := cap(dst) - len(dst); free < len(r.rs) {
		// At least double, so that many small takes stay linear.
		dst = slices.Grow(dst, max(len(r.rs), len(dst)))
	}
	keepRs, keepSq := r.rs[:0], r.sq[:0]
	for i, x := range r.rs {
		if (order == buckets.Desc && x.Ticks > bound) || (order == buckets.Asc && x.Ticks < bound) {
			dst = append(dst, x)
			if r.at != nil {
				delete(r.at, x.Ticks)
			}
			continue
		}
		if r.at != nil {
			r.at[x.Ticks] = len(keepRs)
		}
		keepRs, keepSq = append(keepRs, x), append(keepSq, r.sq[i])
	}
	clear(r.rs[len(keepRs):]) // hold on to no readings given out
	r.rs, r.sq = keepRs, keepSq
	if len(r.rs) == 0 {
		r.at = nil
	} else if len(dst) > start {
		// The readings kept are all on one side of bound.
		if order == buckets.Desc {
			r.hi = min(r.hi, bound)
		} else {
			r.lo = max(r.lo, bound)
		}
	}
	sortReadings(dst[start:], order)
	return dst
}

// sortReadings sorts rs by ticks in order. Runs already in order or
// in reverse order (readings taken from blocks in key order) cost one
// pass.
func sortReadings(rs []buckets.Reading, order buckets.Order) {
	asc := func(a, b buckets.Reading) int { return cmp.Compare(a.Ticks, b.Ticks) }
	if slices.IsSortedFunc(rs, asc) {
		if order == buckets.Desc {
			slices.Reverse(rs)
		}
		return
	}
	slices.SortFunc(rs, func(a, b buckets.Reading) int {
		if order == buckets.Desc {
			a, b = b, a
		}
		switch {
		case a.Ticks < b.Ticks:
			return -1
		case a.Ticks > b.Ticks:
			return 1
		}
		return 0
	})
}
