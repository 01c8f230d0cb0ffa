package block

import (
	"fmt"
	"slices"
	"strings"

	"github.com/telemetryd/telemetryd/buckets"
)

// window is the scanner's storage for Readings: the values that fall in
// the wanted rows, column by column, and where each reading's values go.
type window struct {
	vals  []buckets.Value
	rows  []int32 // row (relative to the window) of each of vals
	ends  []int   // end in vals of each name's values
	count []int32 // values per row, then each row's next slot
}

// Readings decodes the block b and returns, oldest first and each with
// Device set to dev, its readings with lo <= ticks < hi; when limit is
// positive only the newest limit of them (newest true) or the oldest
// limit. They are the readings Decode returns, value for value and bit
// for bit, but only those rows are made into readings: the columns are
// walked in the scanner's buffers and rows outside the window cost no
// allocation. Every column is checked as Decode checks it, so Readings
// accepts exactly the blocks Decode accepts. The readings own their
// memory; the scanner may be reused at once.
func (sc *Scanner) Readings(b []byte, dev buckets.DeviceID, lo, hi buckets.Ticks, limit int, newest bool) ([]buckets.Reading, error) {
	rs, _, err := sc.ReadingsIn(nil, b, dev, lo, hi, limit, newest)
	return rs, err
}

// ReadingsIn is Readings with the readings' values placed in the free
// capacity of vals when it has room for them, else in a new array with
// room to spare. It returns the array they are in, up to their end, so
// that a reader building one answer from many blocks passes it on to
// the next block and can reuse it from answer to answer. Nothing else
// of vals is touched.
func (sc *Scanner) ReadingsIn(vals []buckets.Field, b []byte, dev buckets.DeviceID, lo, hi buckets.Ticks, limit int, newest bool) ([]buckets.Reading, []buckets.Field, error) {
	n, oldest, last, rest, err := sc.header(b)
	if err != nil {
		return nil, vals, err
	}
	raw, err := uncompressInto(sc.buf[:0], rest)
	if err != nil {
		return nil, vals, err
	}
	if len(rest) == 0 || rest[0] != compressNone {
		sc.buf = raw
	}
	r := reader{b: raw}
	if err := sc.times(&r, n, oldest, last); err != nil {
		return nil, vals, err
	}
	i0, i1 := sc.rowsIn(lo, hi, limit, newest)
	if err := sc.windowColumns(&r, n, i0, i1); err != nil {
		return nil, vals, err
	}
	if i0 == i1 {
		return []buckets.Reading{}, vals, nil
	}
	rs, vals := sc.assemble(vals, dev, i0, i1)
	return rs, vals, nil
}

// rowsIn returns the rows [i0, i1) of sc.ticks that Readings returns.
func (sc *Scanner) rowsIn(lo, hi buckets.Ticks, limit int, newest bool) (i0, i1 int) {
	i0, _ = slices.BinarySearch(sc.ticks, lo)
	i1, _ = slices.BinarySearch(sc.ticks, hi)
	i1 = max(i1, i0)
	if limit > 0 && i1-i0 > limit {
		if newest {
			i0 = i1 - limit
		} else {
			i1 = i0 + limit
		}
	}
	return i0, i1
}

// windowColumns reads every column, keeping in sc.win the values of
// rows [i0, i1), and checks that every reading has a value.
func (sc *Scanner) windowColumns(r *reader, n, i0, i1 int) error {
	complete := sc.startCover(n)
	w := &sc.win
	w.vals, w.rows, w.ends = w.vals[:0], w.rows[:0], w.ends[:0]
	for i := range sc.names {
		in := &sc.names[i]
		c, err := sc.readColumn(r, in, n, !complete, true)
		if err != nil {
			return fmt.Errorf("value %q: %w", in.name, err)
		}
		sc.keepRows(&c, in.count, i0, i1)
		w.ends = append(w.ends, len(w.vals))
	}
	return sc.checkEnd(r, complete, n)
}

// keepRows appends to sc.win the values of the column c (of count
// values) that belong to rows [i0, i1).
func (sc *Scanner) keepRows(c *columnParts, count, i0, i1 int) {
	w := &sc.win
	if i0 == i1 {
		return
	}
	sc.dict = sc.dict[:0]
	for range sc.dictRaw {
		sc.dict = append(sc.dict, "")
	}
	// In a column with a value of one kind in every reading, value i is
	// reading i's: the rows before i0 need no walk.
	start := 0
	if c.present == nil && c.single {
		start = i0
	}
	fi, ii, bi, si, j := start, start, start, start, start-1
	for i := start; i < count; i++ {
		j = c.nextRow(j)
		if j >= i1 {
			return
		}
		var v buckets.Value
		switch c.kind(sc, i) {
		case buckets.KindFloat:
			v, fi = buckets.Float(sc.floats[fi]), fi+1
		case buckets.KindInt:
			v, ii = buckets.Int(sc.ints[ii]), ii+1
		case buckets.KindBool:
			v, bi = buckets.Bool(c.boolBits[bi/8]&(1<<(bi%8)) != 0), bi+1
		case buckets.KindString:
			if j >= i0 {
				v = buckets.String(sc.dictString(sc.strIdx[si]))
			}
			si++
		}
		if j >= i0 {
			w.vals = append(w.vals, v)
			w.rows = append(w.rows, int32(j-i0))
		}
	}
}

// dictString returns entry k of the current string dictionary as a
// string of its own, made once per block and column.
func (sc *Scanner) dictString(k uint32) string {
	if sc.dict[k] == "" {
		sc.dict[k] = strings.Clone(string(sc.dictRaw[k]))
	}
	return sc.dict[k]
}

// assemble makes the readings of rows [i0, i1) from sc.win: one slice
// of readings and their values, each reading's in name order, in the
// free capacity of vals when it has room for them or else in a new
// array; the array they are in is returned, up to their end.
func (sc *Scanner) assemble(vals []buckets.Field, dev buckets.DeviceID, i0, i1 int) ([]buckets.Reading, []buckets.Field) {
	w := &sc.win
	rows := i1 - i0
	if cap(w.count) < rows {
		w.count = make([]int32, rows)
	}
	w.count = w.count[:rows]
	clear(w.count)
	for _, j := range w.rows {
		w.count[j]++
	}
	var slab []buckets.Field
	if need := len(w.vals); cap(vals)-len(vals) >= need {
		slab, vals = vals[len(vals):len(vals)+need], vals[:len(vals)+need]
	} else {
		// A new array, with room to spare for the next blocks of the
		// same answer when vals was one.
		slab = make([]buckets.Field, need, max(2*cap(vals), need))
		vals = slab
	}
	rs := make([]buckets.Reading, rows)
	at := int32(0)
	for j := range rs {
		c := w.count[j]
		rs[j] = buckets.Reading{Device: dev, Ticks: sc.ticks[i0+j], Values: slab[at : at : at+c]}
		w.count[j] = at
		at += c
	}
	start := 0
	for k, end := range w.ends {
		if end == start {
			continue
		}
		name := string(sc.names[k].name)
		for x := start; x < end; x++ {
			j := w.rows[x]
			slab[w.count[j]] = buckets.Field{Name: name, Value: w.vals[x]}
			w.count[j]++
		}
		start = end
	}
	for j := range rs {
		rs[j].Values = rs[j].Values[:cap(rs[j].Values)]
	}
	clear(w.vals) // hold on to no strings of the block
	return rs, vals
}
