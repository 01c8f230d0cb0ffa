package store

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/compactplan"
)

// compactplan.Overlapping, which relies on the key order of blocks, agrees with
// comparing every pair of blocks.
func TestOverlappingMatchesPairwise(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 2000 {
		refs := make([]keyedRef, 1+rng.IntN(12))
		for i := range refs {
			oldest := buckets.Ticks(rng.IntN(100))
			r := blockRef{oldest: oldest, newest: oldest + buckets.Ticks(rng.IntN(10)), seq: uint64(i + 1), count: 1}
			refs[i] = keyedRef{blockRef: r, key: appendBlockKey(nil, "dev", r)}
		}
		slices.SortFunc(refs, func(a, b keyedRef) int { return bytes.Compare(a.key, b.key) })
		bs := make([]compactplan.Block, len(refs))
		for i, r := range refs {
			bs[i] = r.planned()
		}
		got := compactplan.Overlapping(bs)
		for i := range refs {
			want := false
			for j := range refs {
				if i != j && refs[i].overlaps(refs[j].blockRef) {
					want = true
				}
			}
			if !assert.Equal(t, want, got[i], "round %d block %d of %+v", round, i, refs) {
				return
			}
		}
	}
}

// A device gets looked at once sixteen small open blocks were noted, or
// once its open blocks span two seal windows, or after a late block.
func TestOpenNoteDue(t *testing.T) {
	t.Parallel()
	n := &openNote{oldWin: buckets.MaxTicks, newWin: -1}
	for i := range compactTierBlocks - 1 {
		n.add(blockRef{oldest: buckets.Ticks(i), newest: buckets.Ticks(i), count: 1})
	}
	assert.False(t, n.due(), "15 small blocks in one window")
	n.add(blockRef{oldest: 20, newest: 20, count: 1})
	assert.True(t, n.due(), "16 small blocks")

	n = &openNote{oldWin: buckets.MaxTicks, newWin: -1}
	n.add(blockRef{oldest: sealWindow - 1, newest: sealWindow - 1, count: 1})
	assert.False(t, n.due())
	n.add(blockRef{oldest: sealWindow, newest: sealWindow, count: 1})
	assert.True(t, n.due(), "a reading in the next window")
}
