package block

import (
	"bytes"
	"fmt"
	"math/bits"
	"slices"
	"strings"

	"github.com/telemetryd/telemetryd/buckets"
)

// Scanner reads the numeric values of a block column by column, for
// queries that fold values into summaries: no reading is materialised
// and its buffers are reused from block to block, so a scan allocates
// nothing once they have grown. It accepts exactly the blocks Decode
// accepts. A Scanner is not safe for concurrent use.
type Scanner struct {
	buf    []byte          // storage for uncompressed columns (never the block's bytes)
	ticks  []buckets.Ticks // the time column
	names  []scanName
	sel    []buckets.Ticks // ticks of the current name's numeric values
	vals   []float64       // the current name's numeric values
	selBuf []buckets.Ticks // storage of sel and vals when they are not
	valBuf []float64       // views of ticks and floats
	floats []float64
	ints   []int64
	kinds  []byte
	cover  []byte // readings that hold at least one value, as bits

	dictRaw [][]byte // the current string column's dictionary
	strIdx  []uint32 // the current string column's indices
	dict    []string // dictRaw entries made strings, "" until used
	win     window
}

// scanName is what the scanner needs of one name of the header.
type scanName struct {
	name       []byte
	kinds      uint8
	count, num int
}

// Numeric decodes the block b and calls fn, in name order, for every
// value name that want accepts and that has numeric values in the
// block, with the ticks and values (ints as float64, bools as 0 or 1;
// strings left out) of the readings that carry it, oldest first. name,
// ticks and vals are only valid during the call. Wanted columns are
// checked as Decode checks them. The block's checksum matched before
// any of it was read, so the columns of the names want refuses are
// skipped, only their lengths read. An error leaves the calls already
// made standing.
func (sc *Scanner) Numeric(b []byte, want func(name []byte) bool, fn func(name []byte, ticks []buckets.Ticks, vals []float64)) error {
	n, oldest, newest, rest, err := sc.header(b)
	if err != nil {
		return err
	}
	raw, err := uncompressInto(sc.buf[:0], rest)
	if err != nil {
		return err
	}
	if len(rest) == 0 || rest[0] != compressNone {
		sc.buf = raw
	}
	r := reader{b: raw}
	if err := sc.times(&r, n, oldest, newest); err != nil {
		return err
	}
	complete := sc.startCover(n)
	for i := range sc.names {
		in := &sc.names[i]
		asked := want(in.name)
		wanted := in.num > 0 && asked
		var err error
		if asked {
			err = sc.column(&r, in, n, wanted, !complete)
		} else {
			err = sc.skipColumn(&r, in, n, !complete)
		}
		if err != nil {
			return fmt.Errorf("value %q: %w", in.name, err)
		}
		if wanted && len(sc.vals) > 0 {
			fn(in.name, sc.sel, sc.vals)
		}
	}
	return sc.checkEnd(&r, complete, n)
}

// startCover reports whether some column has a value for each of the n
// readings; when none has, it clears sc.cover for the columns to mark
// the readings they cover.
func (sc *Scanner) startCover(n int) (complete bool) {
	for i := range sc.names {
		if sc.names[i].count == n {
			return true
		}
	}
	sc.cover = growBytes(sc.cover, (n+7)/8)
	clear(sc.cover)
	return false
}

// checkEnd reports a block whose columns left bytes unread, or, unless
// some column was complete, one of whose n readings no column covered.
func (sc *Scanner) checkEnd(r *reader, complete bool, n int) error {
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(r.b))
	}
	if !complete {
		for i := range n {
			if sc.cover[i/8]&(1<<(i%8)) == 0 {
				return fmt.Errorf("%w: reading %d has no values", ErrCorrupt, i)
			}
		}
	}
	return nil
}

// header reads the header of b as readHeader does, without allocating,
// and returns the bytes after it.
func (sc *Scanner) header(b []byte) (n int, oldest, newest buckets.Ticks, rest []byte, err error) {
	if b, err = body(b); err != nil {
		return 0, 0, 0, nil, err
	}
	r := reader{b: b}
	count, o, span, names := r.uvarint("count"), r.uvarint("oldest"), r.uvarint("span"), r.uvarint("names")
	if r.err != nil || count == 0 || count > MaxReadings || names == 0 || names > MaxNames ||
		o > uint64(buckets.MaxTicks) || span > uint64(buckets.MaxTicks)-o || (count == 1) != (span == 0) {
		return 0, 0, 0, nil, fmt.Errorf("%w: bad header", ErrCorrupt)
	}
	sc.names = sc.names[:0]
	total := uint64(0)
	for i := range int(names) {
		var in scanName
		in.name = r.bytes(r.uvarint("name length"), "name")
		in.kinds = r.byte("kinds")
		c, num := r.uvarint("name count"), r.uvarint("numeric count")
		if r.err != nil || len(in.name) == 0 || (i > 0 && bytes.Compare(in.name, sc.names[i-1].name) <= 0) ||
			in.kinds == 0 || in.kinds&^validKinds != 0 || c == 0 || c > count || num > c {
			return 0, 0, 0, nil, fmt.Errorf("%w: bad value name %d", ErrCorrupt, i)
		}
		in.count, in.num = int(c), int(num)
		if total += c; total > MaxFields {
			return 0, 0, 0, nil, fmt.Errorf("%w: %d values", ErrCorrupt, total)
		}
		if num > 0 {
			var s buckets.Summary
			readSummary(&r, &s)
			if ft, lt := r.uvarint("first ticks"), r.uvarint("last ticks"); ft > span || lt > span {
				r.fail("summary ticks")
			}
		}
		if r.err != nil {
			return 0, 0, 0, nil, r.err
		}
		sc.names = append(sc.names, in)
	}
	return int(count), buckets.Ticks(o), buckets.Ticks(o + span), r.b, nil
}

// times reads the time column into sc.ticks, as decodeTimes does.
func (sc *Scanner) times(r *reader, n int, oldest, newest buckets.Ticks) error {
	if cap(sc.ticks) < n {
		sc.ticks = make([]buckets.Ticks, n)
	}
	ts := sc.ticks[:n]
	k, gap := oldest, int64(0)
	ts[0] = k
	for i := 1; i < n; i++ {
		dod := r.fastVarint("time")
		g, overflow := addInt64(gap, dod)
		if r.err != nil || overflow || g <= 0 || g > int64(newest-k) {
			return fmt.Errorf("%w: bad time column at reading %d", ErrCorrupt, i)
		}
		gap = g
		k += buckets.Ticks(g)
		ts[i] = k
	}
	if k != newest {
		return fmt.Errorf("%w: times end at %d, header says %d", ErrCorrupt, k, newest)
	}
	sc.ticks = ts
	return nil
}

// column reads the column of in. When wanted, sc.sel and sc.vals hold
// its numeric values afterwards; when cover, the readings it is present
// in are marked in sc.cover.
func (sc *Scanner) column(r *reader, in *scanName, n int, wanted, cover bool) error {
	c, err := sc.readColumn(r, in, n, cover, false)
	if err != nil || !wanted {
		return err
	}
	if c.single && c.present == nil && c.counts[buckets.KindFloat] == n {
		sc.sel, sc.vals = sc.ticks, sc.floats
		return nil
	}
	sc.selBuf, sc.valBuf = sc.selBuf[:0], sc.valBuf[:0]
	defer func() { sc.sel, sc.vals = sc.selBuf, sc.valBuf }()
	fi, ii, bi, j := 0, 0, 0, -1
	for i := range in.count {
		j = c.nextRow(j)
		var x float64
		switch c.kind(sc, i) {
		case buckets.KindFloat:
			x, fi = sc.floats[fi], fi+1
		case buckets.KindInt:
			x, ii = float64(sc.ints[ii]), ii+1
		case buckets.KindBool:
			if c.boolBits[bi/8]&(1<<(bi%8)) != 0 {
				x = 1
			}
			bi++
		default:
			continue
		}
		sc.selBuf = append(sc.selBuf, sc.ticks[j])
		sc.valBuf = append(sc.valBuf, x)
	}
	return nil
}

// columnParts is a column read by readColumn: its floats and ints are
// in the scanner's buffers (and, when kept, its strings in sc.dictRaw
// and sc.strIdx), its kinds in sc.kinds unless single.
type columnParts struct {
	present  []byte // presence bitmap; nil: every reading
	single   bool   // one kind only
	kinds    uint8
	counts   [buckets.KindString + 1]int
	boolBits []byte
}

// nextRow returns the reading of the value after the one of reading j.
func (c *columnParts) nextRow(j int) int {
	j++
	for c.present != nil && c.present[j/8]&(1<<(j%8)) == 0 {
		j++
	}
	return j
}

// kind returns the kind of the i-th value.
func (c *columnParts) kind(sc *Scanner, i int) buckets.Kind {
	if c.single {
		return buckets.Kind(bits.TrailingZeros8(c.kinds))
	}
	return buckets.Kind(sc.kinds[i])
}

// readColumn reads and checks the column of in as decodeColumn does.
// When cover, the readings it is present in are marked in sc.cover;
// when strs, its string dictionary and indices are kept.
func (sc *Scanner) readColumn(r *reader, in *scanName, n int, cover, strs bool) (columnParts, error) {
	c := columnParts{kinds: in.kinds}
	if in.count < n {
		c.present = r.bytes(uint64((n+7)/8), "bitmap")
		if r.err != nil {
			return c, r.err
		}
		got := 0
		for i, b := range c.present {
			if i == len(c.present)-1 && n%8 != 0 {
				b &= 1<<(n%8) - 1 // bits past n are not readings
			}
			got += bits.OnesCount8(b)
		}
		if got != in.count {
			return c, fmt.Errorf("%w: presence bitmap has %d values, header says %d", ErrCorrupt, got, in.count)
		}
		if cover {
			for i := range sc.cover {
				sc.cover[i] |= c.present[i]
			}
		}
	} else if cover {
		for i := range sc.cover {
			sc.cover[i] = 0xff
		}
	}
	c.single = bits.OnesCount8(in.kinds) == 1
	if c.single {
		c.counts[bits.TrailingZeros8(in.kinds)] = in.count
	} else {
		sc.kinds = growBytes(sc.kinds, in.count)
		for i := range sc.kinds {
			k := r.byte("kind")
			if in.kinds&(1<<k) == 0 || buckets.Kind(k) > buckets.KindString {
				r.fail("kind")
				return c, r.err
			}
			sc.kinds[i] = k
			c.counts[k]++
		}
	}
	sc.floats = sc.readFloats(r, c.counts[buckets.KindFloat])
	sc.ints = sc.readInts(r, c.counts[buckets.KindInt])
	if nb := c.counts[buckets.KindBool]; nb > 0 {
		c.boolBits = r.bytes(uint64((nb+7)/8), "bitmap")
	}
	sc.strings(r, c.counts[buckets.KindString], strs)
	if r.err != nil {
		return c, r.err
	}
	if numeric := in.count - c.counts[buckets.KindString]; numeric != in.num {
		return c, fmt.Errorf("%w: %d numeric values, header says %d", ErrCorrupt, numeric, in.num)
	}
	return c, nil
}

// readFloats is readFloats into the scanner's buffer.
func (sc *Scanner) readFloats(r *reader, n int) []float64 {
	if n == 0 {
		return sc.floats[:0]
	}
	if cap(sc.floats) < n {
		sc.floats = make([]float64, n)
	}
	return readFloatsInto(r, sc.floats[:n])
}

// readInts is readInts into the scanner's buffer.
func (sc *Scanner) readInts(r *reader, n int) []int64 {
	if cap(sc.ints) < n {
		sc.ints = make([]int64, n)
	}
	return readIntsInto(r, sc.ints[:n])
}

// strings reads a string column of n values, checking it as
// readStrings does; when keep, the dictionary (as views of the column
// bytes) is left in sc.dictRaw and the index of each value in
// sc.strIdx.
func (sc *Scanner) strings(r *reader, n int, keep bool) {
	if n == 0 {
		return
	}
	size := r.uvarint("dictionary size")
	if size == 0 || size > uint64(n) {
		r.fail("dictionary size")
		return
	}
	sc.dictRaw = sc.dictRaw[:0]
	for range size {
		l := r.uvarint("string length")
		if l > buckets.MaxStringLen {
			r.fail("string length")
			return
		}
		p := r.bytes(l, "string")
		if keep {
			sc.dictRaw = append(sc.dictRaw, p)
		}
	}
	if keep {
		sc.strIdx = sc.strIdx[:0]
	}
	for range n {
		j := uint64(0)
		if size > 1 {
			if j = r.uvarint("string index"); j >= size {
				r.fail("string index")
				return
			}
		}
		if keep {
			sc.strIdx = append(sc.strIdx, uint32(j))
		}
	}
}

// growBytes returns b resized to n bytes, reusing its storage.
func growBytes(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

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
