// Package spans keeps a small set of ranges of ticks that covers every
// range added to it, in a fixed size: a day table's write tracker keeps
// one per device for the readings written since the table was opened.
package spans

import "github.com/telemetryd/telemetryd/buckets"

// maxSpans bounds the ranges of a Set; past it the two closest merge,
// so a Set covers more than was added, never less.
const maxSpans = 4

// Set is a small set of disjoint ranges of ticks, sorted, covering
// every range added to it (and, once more than maxSpans were apart,
// the gaps between some of them). The zero value is empty.
type Set struct {
	n int
	r [maxSpans + 1]span
}

// span is the ticks from lo to hi, both included.
type span struct{ lo, hi buckets.Ticks }

// Overlaps reports whether some tick from lo to hi is covered.
func (s *Set) Overlaps(lo, hi buckets.Ticks) bool {
	for _, r := range s.r[:s.n] {
		if r.lo <= hi && lo <= r.hi {
			return true
		}
	}
	return false
}

// Add covers the ticks from lo to hi (lo <= hi).
func (s *Set) Add(lo, hi buckets.Ticks) {
	// The ranges i to j-1 overlap [lo, hi] or touch it: they become one.
	i := 0
	for i < s.n && s.r[i].hi < lo-1 {
		i++
	}
	j := i
	for j < s.n && s.r[j].lo <= hi+1 {
		lo, hi = min(lo, s.r[j].lo), max(hi, s.r[j].hi)
		j++
	}
	switch {
	case j == i: // none: make room
		copy(s.r[i+1:s.n+1], s.r[i:s.n])
		s.n++
	case j > i+1:
		copy(s.r[i+1:], s.r[j:s.n])
		s.n -= j - i - 1
	}
	s.r[i] = span{lo, hi}
	if s.n <= maxSpans {
		return
	}
	// One too many: the two closest neighbours become one.
	best := 0
	for k := 1; k+1 < s.n; k++ {
		if s.r[k+1].lo-s.r[k].hi < s.r[best+1].lo-s.r[best].hi {
			best = k
		}
	}
	s.r[best].hi = s.r[best+1].hi
	copy(s.r[best+1:], s.r[best+2:s.n])
	s.n--
}
