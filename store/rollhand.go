package store

import (
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/aggregate"
	"github.com/telemetryd/telemetryd/store/rollup"
)

// inHand is what a compaction just wrote for a device: its new blocks
// and their readings. An hour whose every block is among them is rolled
// up from them, without reading the table again, with exactly the
// arithmetic of a table read (rollSource.Buckets): the same blocks, visited
// newest first, summarised from their headers where a block lies in one
// bucket, else value by value in time order.
type inHand struct {
	dev     buckets.DeviceID
	entries []entry             // the new blocks, oldest first
	chunks  [][]buckets.Reading // each entry's readings
	others  []keyedRef          // the device's other blocks the compaction saw
	sealed  buckets.Ticks       // newest reading of sealed blocks it did not see (-1: none)
}

// newInHand describes a compaction that replaced take (of refs) with
// entries, cut in order from merged; sealed is as readCompaction says.
func newInHand(dev buckets.DeviceID, refs, take []keyedRef, entries []entry, merged []buckets.Reading, sealed buckets.Ticks) *inHand {
	h := &inHand{dev: dev, entries: entries, sealed: sealed}
	for _, e := range entries {
		h.chunks = append(h.chunks, merged[:e.ref.count])
		merged = merged[e.ref.count:]
	}
	for _, r := range refs {
		if len(take) > 0 && string(take[0].key) == string(r.key) {
			take = take[1:]
			continue
		}
		h.others = append(h.others, r)
	}
	return h
}

// Covers reports whether every block of the device in [lo, hi) is one
// of the new blocks.
func (h *inHand) Covers(lo, hi buckets.Ticks) bool {
	if h == nil || h.sealed >= lo {
		return false
	}
	for _, r := range h.others {
		if r.oldest < hi && r.newest >= lo {
			return false
		}
	}
	return true
}

// Buckets is the device's buckets of interval in [lo, hi), which covers
// says the new blocks hold.
func (h *inHand) Buckets(interval, lo, hi buckets.Ticks) ([]rollup.Bucket, error) {
	a := aggregate.New(buckets.AggregateQuery{Device: h.dev, From: lo, To: hi, Interval: interval, Limit: int(sealWindow / buckets.TicksPerSecond)}, 0)
	for i := len(h.entries) - 1; i >= 0; i-- { // newest first, as keys sort
		e := h.entries[i]
		if e.ref.oldest >= hi || e.ref.newest < lo {
			continue
		}
		a.Note(aggRef(e.ref), e.meta&metaDistinctMs != 0)
		if e.ref.oldest >= lo && e.ref.newest < hi && a.BucketOf(e.ref.oldest) == a.BucketOf(e.ref.newest) {
			if err := a.AddHeader(aggRef(e.ref), e.value); err != nil {
				return nil, &blockError{ref: e.ref, err: err}
			}
			continue
		}
		a.AddChunk(h.chunks[i], lo, hi)
	}
	return rollup.PageOf(a, interval), nil
}
