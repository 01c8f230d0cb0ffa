package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
	"github.com/telemetryd/telemetryd/store/resolve"
)

// Samples calls fn once for each of names that has numeric values
// (ints as float64, bools as 0 or 1) in readings of dev with from <=
// ticks < to, with their ticks and values, oldest first; names without
// one are left out. The values are exactly those Range gives for the
// same span (for each ticks the reading of the block with the highest
// sequence), but only the time column and the named values' columns
// are read: blocks that overlap no other block are never assembled
// into readings. ticks and vals are fn's to keep.
func (s *Store) Samples(ctx context.Context, dev buckets.DeviceID, from, to buckets.Ticks, names []string, fn func(name string, ticks []buckets.Ticks, vals []float64)) error {
	if err := s.Ping(ctx); err != nil {
		return err
	}
	first, last, ok := s.index.Bounds(dev)
	if !ok || len(names) == 0 {
		return nil
	}
	from = max(from, buckets.DayOf(first).Start(), 0)
	to = min(to, buckets.DayOf(last).End(), buckets.MaxTicks+1)
	if from >= to {
		return nil
	}
	sr := &sampleReader{dev: dev, cols: make([]sampleColumn, len(names)), at: make(map[string]int, len(names))}
	for i, n := range names {
		sr.at[n] = i
	}
	sc := scanners.Get().(*block.Scanner)
	defer scanners.Put(sc)
	for _, d := range s.daysBetween(buckets.DayOf(from), buckets.DayOf(to-1), buckets.Asc) {
		t, err := s.acquireQuery(ctx, d)
		if err != nil {
			return err
		}
		if t == nil {
			continue // dropped meanwhile
		}
		err = s.guard(t, func() error {
			return sr.table(ctx, t, sc, max(from, d.Start()), min(to, d.End()))
		})
		s.release(t)
		if err != nil {
			return classify(fmt.Errorf("read table %s: %s: %w", d, dev, err))
		}
	}
	for i, n := range names {
		if c := &sr.cols[i]; len(c.ticks) > 0 {
			fn(n, c.ticks, c.vals)
		}
	}
	return nil
}

// sampleReader gathers the samples of one Samples call.
type sampleReader struct {
	dev  buckets.DeviceID
	cols []sampleColumn // per name asked for
	at   map[string]int // name -> index in cols
}

// sampleColumn is the samples of one name, oldest first.
type sampleColumn struct {
	ticks []buckets.Ticks
	vals  []float64
}

// sampleBlock is a block of the span being read.
type sampleBlock struct {
	ref   blockRef
	value []byte
}

// table adds the samples of t in [lo, hi): the blocks are taken by
// their oldest reading; a block that overlaps no other is read column
// by column, a run of overlapping blocks is decoded and resolved as
// Range resolves it.
func (sr *sampleReader) table(ctx context.Context, t *table, sc *block.Scanner, lo, hi buckets.Ticks) error {
	txn, done := t.ver.ReadTxn(t.db)
	defer done()
	var blocks []sampleBlock
	err := eachBlock(txn, sr.dev, lo, func(bi blockItem) (bool, error) {
		if bi.ref.oldest >= hi {
			return true, nil
		}
		v, err := bi.item.ValueCopy(nil)
		blocks = append(blocks, sampleBlock{bi.ref, v})
		return true, err
	})
	if err != nil {
		return err
	}
	slices.SortFunc(blocks, func(a, b sampleBlock) int { return cmp.Compare(a.ref.oldest, b.ref.oldest) })
	for i := 0; i < len(blocks); {
		n, end := 1, blocks[i].ref.newest
		for i+n < len(blocks) && blocks[i+n].ref.oldest <= end {
			end = max(end, blocks[i+n].ref.newest)
			n++
		}
		if n == 1 {
			err = sr.columns(ctx, t, sc, blocks[i], lo, hi)
		} else {
			err = sr.resolve(ctx, t, blocks[i:i+n], lo, hi)
		}
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		i += n
	}
	return nil
}

// columns adds the samples in [lo, hi) of a block that overlaps no
// other block. A damaged block adds nothing.
func (sr *sampleReader) columns(ctx context.Context, t *table, sc *block.Scanner, b sampleBlock, lo, hi buckets.Ticks) error {
	var lens []int // per column, its length before the block
	for i := range sr.cols {
		lens = append(lens, len(sr.cols[i].ticks))
	}
	err := sc.Numeric(b.value, func(name []byte) bool { _, ok := sr.at[string(name)]; return ok },
		func(name []byte, ticks []buckets.Ticks, vals []float64) {
			i0, _ := slices.BinarySearch(ticks, lo)
			i1, _ := slices.BinarySearch(ticks, hi)
			c := &sr.cols[sr.at[string(name)]]
			c.ticks = append(c.ticks, ticks[i0:i1]...)
			c.vals = append(c.vals, vals[i0:i1]...)
		})
	if err != nil {
		for i, n := range lens {
			sr.cols[i].ticks, sr.cols[i].vals = sr.cols[i].ticks[:n], sr.cols[i].vals[:n]
		}
		err = &blockError{ref: b.ref, err: err}
		if t.bad.skip(ctx, t.day, sr.dev, err) {
			return nil
		}
		return err
	}
	return nil
}

// resolve adds the samples in [lo, hi) of blocks that overlap: decoded
// into readings, for each ticks the reading of the highest sequence.
// A damaged block is left out.
func (sr *sampleReader) resolve(ctx context.Context, t *table, blocks []sampleBlock, lo, hi buckets.Ticks) error {
	res := resolve.New()
	for _, b := range blocks {
		rs, err := readBlock(b.value, sr.dev, lo, hi, 0, false, nil)
		if err != nil {
			err = &blockError{ref: b.ref, err: err}
			if !t.bad.skip(ctx, t.day, sr.dev, err) {
				return err
			}
			continue
		}
		res.Add(rs, b.ref.seq, lo, hi)
	}
	for _, r := range res.Take(buckets.Asc, hi) {
		for _, f := range r.Values {
			i, ok := sr.at[f.Name]
			if !ok {
				continue
			}
			if x, ok := buckets.Numeric(f.Value); ok {
				c := &sr.cols[i]
				c.ticks, c.vals = append(c.ticks, r.Ticks), append(c.vals, x)
			}
		}
	}
	return nil
}
