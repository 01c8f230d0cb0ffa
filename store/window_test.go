package store

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// TestReadsCutInsideOverlappingBlocks writes blocks that overlap (a
// later write of the same ticks wins) and checks latest-N, ranges in
// both orders (whole and paged by cursor) and point reads against a
// model, for windows and limits whose edges fall inside blocks, on
// their edges and between them: the reads that decode only the rows
// they return must give what decoding whole blocks gave.
func TestReadsCutInsideOverlappingBlocks(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	base := dayTick(today, time.Hour)
	sec := buckets.Ticks(buckets.TicksPerSecond)
	model := map[buckets.Ticks]buckets.Reading{}
	put := func(first, step buckets.Ticks, n int, v int) {
		var rs []buckets.Reading
		for i := range n {
			r := reading("dev", base+first+buckets.Ticks(i)*step, "v", v, "i", i)
			rs = append(rs, r)
			model[r.Ticks] = r
		}
		ts.write(t, rs...)
	}
	put(0, sec, 100, 1)         // 0..99 s
	put(50*sec, 2*sec, 50, 2)   // 50..148 s every 2 s, over the first
	put(10*sec, sec, 11, 3)     // 10..20 s, over the first again
	put(300*sec, sec, 30, 4)    // 300..329 s, apart
	put(149*sec, 151*sec, 2, 5) // 149 s and 300 s: bridges the gap
	ts.write(t, series("dev-2", base, time.Second, 50)...)

	var want []buckets.Reading // oldest first
	for _, k := range slices.Sorted(func(yield func(buckets.Ticks) bool) {
		for k := range model {
			if !yield(k) {
				return
			}
		}
	}) {
		want = append(want, model[k])
	}
	check := func(t *testing.T) {
		for _, n := range []int{1, 2, 10, 11, 31, 80, 1000} {
			got, err := ts.Latest(ctx, "dev", n)
			require.NoError(t, err)
			require.Equal(t, reversed(want)[:min(n, len(want))], got, "latest %d", n)
		}
		edges := []buckets.Ticks{0, 9, 10, 20, 21, 49, 50, 51, 99, 100, 148, 149, 150, 299, 300, 301, 329, 330}
		for _, lo := range edges {
			for _, hi := range edges {
				for _, limit := range []int{1, 3, 7, 1000} {
					checkRange(t, ts, want, base+lo*sec, base+hi*sec, limit)
				}
			}
		}
		for _, r := range want {
			got, err := ts.Get(ctx, "dev", r.Ticks)
			require.NoError(t, err)
			require.Equal(t, r, got)
		}
		_, err := ts.Get(ctx, "dev", base+200*sec)
		require.ErrorIs(t, err, buckets.ErrNotFound)
	}
	t.Run("small blocks", check)
	ts = ts.reopen(t)
	t.Run("after reopening", check)
}

// checkRange pages through [lo, hi) in both orders, limit readings a
// page, and requires the pages to add up to want's readings there.
func checkRange(t *testing.T, ts *testStore, want []buckets.Reading, lo, hi buckets.Ticks, limit int) {
	t.Helper()
	var in []buckets.Reading
	for _, r := range want {
		if r.Ticks >= lo && r.Ticks < hi {
			in = append(in, r)
		}
	}
	for _, order := range []buckets.Order{buckets.Asc, buckets.Desc} {
		exp := in
		if order == buckets.Desc {
			exp = reversed(in)
		}
		q := buckets.RangeQuery{Device: "dev", From: lo, To: hi, Order: order, Limit: limit}
		var got []buckets.Reading
		for page := 0; ; page++ {
			require.Less(t, page, len(in)+2, "paging ends")
			p, err := ts.Range(context.Background(), q)
			require.NoError(t, err)
			require.LessOrEqual(t, len(p.Readings), limit)
			got = append(got, p.Readings...)
			if !p.More {
				break
			}
			after := p.Readings[len(p.Readings)-1].Ticks
			q.After = &after
		}
		require.Equal(t, fmt.Sprint(exp), fmt.Sprint(got), "range [%d, %d) %v limit %d", lo, hi, order, limit)
	}
}
