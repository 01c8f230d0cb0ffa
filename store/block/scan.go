package block

import (
	"bytes"
	"fmt"
	"math/bits"

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

// uncompressInto returns the raw columns that follow the header, in
// dst's storage when it is large enough. The block's checksum matched
// before (so zstd's checksum of the output is skipped).
func uncompressInto(dst, rest []byte) ([]byte, error) {
	r := reader{b: rest}
	mode := r.byte("compression")
	size := r.uvarint("raw size")
	if r.err != nil || size > MaxRawBytes {
		return nil, fmt.Errorf("%w: bad compression header", ErrCorrupt)
	}
	switch mode {
	case compressNone:
		if uint64(len(r.b)) != size {
			return nil, fmt.Errorf("%w: raw size", ErrCorrupt)
		}
		return r.b, nil
	case compressZstd:
		_, dec := codecs()
		if uint64(cap(dst)) < size {
			dst = make([]byte, 0, size)
		}
		raw, err := dec.DecodeAll(r.b, dst[:0])
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		if uint64(len(raw)) != size {
			return nil, fmt.Errorf("%w: raw size", ErrCorrupt)
		}
		return raw, nil
	}
	return nil, fmt.Errorf("%w: compression %d", ErrCorrupt, mode)
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

// fastVarint is varint with the one- and two-byte cases (steady
// times, decimals that change by less than 8,192 steps) done in place;
// they decode as binary.Varint decodes them.
func (r *reader) fastVarint(what string) int64 {
	if len(r.b) > 0 && r.b[0] < 0x80 {
		u := int64(r.b[0])
		r.b = r.b[1:]
		return u>>1 ^ -(u & 1)
	}
	if len(r.b) > 1 && r.b[1] < 0x80 {
		u := int64(r.b[0]&0x7f) | int64(r.b[1])<<7
		r.b = r.b[2:]
		return u>>1 ^ -(u & 1)
	}
	return r.varint(what)
}

// growBytes returns b resized to n bytes, reusing its storage.
func growBytes(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
