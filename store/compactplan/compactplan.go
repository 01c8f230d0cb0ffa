// Package compactplan chooses which blocks of a device a compaction
// merges: the open blocks of a size tier that has TierBlocks of them
// (and every tier below), every open block once one is older than the
// device's newest seal window, an open block that overlaps another, and
// then every block that overlaps a chosen one. A full compaction (the
// table went quiet or closes) takes every open block that is not alone
// in the newest window.
package compactplan

import (
	"math/bits"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// Block is what a plan needs of a stored block: the span of its
// readings, how many it holds and whether it is sealed.
type Block struct {
	Oldest, Newest buckets.Ticks
	Count          int
	Sealed         bool
}

// overlaps reports whether the time spans of a and b intersect.
func (a Block) overlaps(b Block) bool {
	return a.Oldest <= b.Newest && b.Oldest <= a.Newest
}

// Window is the time span one sealed block covers at most.
const Window = buckets.Ticks(time.Hour / 100)

// WindowStart is the start of the seal window holding k.
func WindowStart(k buckets.Ticks) buckets.Ticks {
	return k - k%Window // the tick epoch is a whole number of days before the Unix one
}

// TierBlocks is how many open blocks of one size tier trigger a
// merge. It is also the factor between tiers (TierOf).
const TierBlocks = 16

// Take marks the blocks to merge of refs (newest first, as their keys
// sort), or returns nil for none: the open blocks that trigger a merge
// (triggered), and every block overlapping one of those (withOverlaps).
func Take(refs []Block, full bool) []bool {
	take := triggered(refs, full)
	if take == nil {
		return nil
	}
	withOverlaps(refs, take)
	return take
}

// TierOf is the size tier of a block: a factor of TierBlocks
// (sixteen) per tier, 1-15 readings being tier 0.
func TierOf(count int) int { return min((bits.Len(uint(max(count, 1)))-1)/4, maxTier) }

// maxTier is the highest size tier.
const maxTier = 7

// triggered marks the open blocks of refs that must be merged now, or
// returns nil when none must.
func triggered(refs []Block, full bool) []bool {
	var open []int
	var tiers [maxTier + 1]int
	for i, r := range refs {
		if !r.Sealed {
			open = append(open, i)
			tiers[TierOf(r.Count)]++
		}
	}
	if len(open) == 0 {
		return nil
	}
	// top is the highest tier with TierBlocks blocks: it and
	// the tiers below are merged.
	top := -1
	for tier, n := range tiers {
		if n >= TierBlocks {
			top = tier
		}
	}
	current := WindowStart(refs[0].Newest)
	ov := Overlapping(refs)
	take := make([]bool, len(refs))
	any, all := false, false
	for _, i := range open {
		r := refs[i]
		switch {
		case full && (len(open) > 1 || r.Oldest < current || ov[i]):
			take[i], any = true, true
		case r.Oldest < current:
			all = true
		case ov[i]:
			// Merged with the blocks it overlaps (withOverlaps), not
			// with every open block: a write that merges into the
			// newest reading of its device (the two halves of a
			// reading in two requests) would otherwise rewrite every
			// open block of the window each time.
			take[i], any = true, true
		}
	}
	for _, i := range open {
		if all || TierOf(refs[i].Count) <= top {
			take[i], any = true, true
		}
	}
	if !any {
		return nil
	}
	return take
}

// Overlapping reports for each block of refs whether it overlaps
// another. Keys sort blocks newest first (by their newest reading), so
// a block overlaps a later one exactly when the next block's newest
// reading is not older than its oldest, and an earlier one exactly when
// the oldest reading of the blocks before it is not newer than its
// newest.
func Overlapping(refs []Block) []bool {
	ov := make([]bool, len(refs))
	before := buckets.MaxTicks + 1 // oldest reading of refs[:i]
	for i, r := range refs {
		ov[i] = before <= r.Newest || (i+1 < len(refs) && refs[i+1].Newest >= r.Oldest)
		before = min(before, r.Oldest)
	}
	return ov
}

// withOverlaps adds to take every block that overlaps a taken one,
// until none is left.
func withOverlaps(refs []Block, take []bool) {
	for changed := true; changed; {
		changed = false
		for i := range refs {
			if take[i] {
				continue
			}
			for j := range refs {
				if take[j] && refs[i].overlaps(refs[j]) {
					take[i], changed = true, true
					break
				}
			}
		}
	}
}
