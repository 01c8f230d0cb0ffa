package block

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"math/bits"
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/telemetryd/telemetryd/buckets"
)

// reader reads a byte slice, remembering the first failure so callers
// check once at the end.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrCorrupt, what)
	}
	r.b = nil
}

func (r *reader) uvarint(what string) uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint(what string) int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte(what string) byte {
	if len(r.b) < 1 {
		r.fail(what)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) bytes(n uint64, what string) []byte {
	if n > uint64(len(r.b)) {
		r.fail(what)
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) float(what string) float64 {
	p := r.bytes(8, what)
	if p == nil {
		return 0
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(p))
}

// body checks the version of the block b and, for a block of Version,
// its checksum, and returns the bytes between the version byte and the
// checksum. Every reader of a block starts here, so no byte of a
// checksummed block is interpreted before the checksum matched.
func body(b []byte) ([]byte, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrCorrupt)
	}
	if b[0] != Version {
		return nil, fmt.Errorf("%w %d", ErrVersion, b[0])
	}
	n := len(b) - checksumLen
	if n < 2 {
		return nil, fmt.Errorf("%w: %d bytes is too short for a checksum", ErrCorrupt, len(b))
	}
	stored, sum := binary.BigEndian.Uint32(b[n:]), crc32.Checksum(b[:n], castagnoli)
	if stored != sum {
		return nil, fmt.Errorf("%w (stored %08x, computed %08x)", ErrChecksum, stored, sum)
	}
	return b[1:n], nil
}

// Checksummed reports whether the block b is of a version that carries
// a checksum (it does not check it: every reader does).
func Checksummed(b []byte) bool { return len(b) > 0 && b[0] == Version }

// ReadHeader decodes the header of the block b. It does not look at
// the columns, but does check the checksum of the whole block.
func ReadHeader(b []byte) (Header, error) {
	h, _, err := readHeader(b)
	return h, err
}

// readHeader decodes the header and returns the bytes after it.
func readHeader(b []byte) (Header, []byte, error) {
	var h Header
	b, err := body(b)
	if err != nil {
		return h, nil, err
	}
	r := reader{b: b}
	n := r.uvarint("count")
	oldest := r.uvarint("oldest")
	span := r.uvarint("span")
	names := r.uvarint("names")
	if r.err != nil || n == 0 || n > MaxReadings || names == 0 || names > MaxNames ||
		oldest > uint64(buckets.MaxTicks) || span > uint64(buckets.MaxTicks)-oldest || (n == 1) != (span == 0) {
		return h, nil, fmt.Errorf("%w: bad header", ErrCorrupt)
	}
	h.Count, h.Oldest, h.Newest = int(n), buckets.Ticks(oldest), buckets.Ticks(oldest+span)
	h.Names = make([]NameInfo, names)
	for i := range h.Names {
		in := &h.Names[i]
		in.Name = string(r.bytes(r.uvarint("name length"), "name"))
		in.Kinds = r.byte("kinds")
		count, num := r.uvarint("name count"), r.uvarint("numeric count")
		if r.err != nil || in.Name == "" || (i > 0 && in.Name <= h.Names[i-1].Name) ||
			in.Kinds == 0 || in.Kinds&^validKinds != 0 || count == 0 || count > n || num > count {
			return h, nil, fmt.Errorf("%w: bad value name %d", ErrCorrupt, i)
		}
		in.Count = int(count)
		if num > 0 {
			s := &in.Num
			s.Count = int64(num)
			readSummary(&r, s)
			ft, lt := r.uvarint("first ticks"), r.uvarint("last ticks")
			if ft > span || lt > span {
				r.fail("summary ticks")
			}
			s.FirstTicks, s.LastTicks = h.Oldest+buckets.Ticks(ft), h.Oldest+buckets.Ticks(lt)
		}
	}
	if r.err != nil {
		return h, nil, r.err
	}
	return h, r.b, nil
}

// readSummary reads the numbers appendSummary wrote.
func readSummary(r *reader, s *buckets.Summary) {
	mode := int(r.byte("summary encoding"))
	if mode == 0 {
		s.Sum, s.Min, s.Max = r.float("sum"), r.float("min"), r.float("max")
		s.First, s.Last = r.float("first"), r.float("last")
		return
	}
	if mode-1 > maxDecimals {
		r.fail("summary encoding")
		return
	}
	p := pow10[mode-1]
	s.Min, s.Max = float64(r.varint("min"))/p, float64(r.varint("max"))/p
	s.First, s.Last = float64(r.varint("first"))/p, float64(r.varint("last"))/p
	s.Sum = float64(r.varint("sum")) / p
}

// validKinds has the bit of every known kind.
const validKinds = 1<<buckets.KindFloat | 1<<buckets.KindInt | 1<<buckets.KindBool | 1<<buckets.KindString

// Decode returns the header and the readings of the block b, oldest
// first, each with Device set to dev. It never panics and never
// allocates beyond the limits of a block, whatever b holds.
func Decode(b []byte, dev buckets.DeviceID) (Header, []buckets.Reading, error) {
	h, rest, err := readHeader(b)
	if err != nil {
		return h, nil, err
	}
	raw, err := uncompress(rest)
	if err != nil {
		return h, nil, err
	}
	r := reader{b: raw}
	rs := make([]buckets.Reading, h.Count)
	if err := decodeTimes(&r, h, rs, dev); err != nil {
		return h, nil, err
	}
	total := 0
	for _, in := range h.Names {
		total += in.Count
	}
	if total > MaxFields {
		return h, nil, fmt.Errorf("%w: %d values", ErrCorrupt, total)
	}
	slab := make([]buckets.Field, 0, total)
	cols := make([]decodedColumn, len(h.Names))
	for i := range h.Names {
		cols[i], err = decodeColumn(&r, &h.Names[i], h.Count)
		if err != nil {
			return h, nil, fmt.Errorf("value %q: %w", h.Names[i].Name, err)
		}
	}
	if len(r.b) != 0 {
		return h, nil, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(r.b))
	}
	if err := assembleRows(h, cols, rs, slab); err != nil {
		return h, nil, err
	}
	return h, rs, nil
}

// assembleRows gives each reading its values from the columns. Names
// are sorted, so each reading's values come out sorted.
func assembleRows(h Header, cols []decodedColumn, rs []buckets.Reading, slab []buckets.Field) error {
	next := make([]int, len(cols))
	for i := range rs {
		start := len(slab)
		for j := range cols {
			c := &cols[j]
			if c.present != nil && !c.present[i] {
				continue
			}
			slab = append(slab, buckets.Field{Name: h.Names[j].Name, Value: c.values[next[j]]})
			next[j]++
		}
		if len(slab) == start {
			return fmt.Errorf("%w: reading %d has no values", ErrCorrupt, i)
		}
		rs[i].Values = slab[start:len(slab):len(slab)]
	}
	return nil
}

var (
	encoderOnce sync.Once
	encoder     *zstd.Encoder
	// decoder decodes the frames of blocks, which every reader does only
	// after the block's CRC-32C matched: those bytes are the encoder's,
	// so zstd's own checksum of the output is not computed again.
	decoder *zstd.Decoder
)

// codecs returns the shared zstd encoder and decoder; both are safe
// for concurrent EncodeAll and DecodeAll calls.
func codecs() (*zstd.Encoder, *zstd.Decoder) {
	encoderOnce.Do(func() {
		var err error
		encoder, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault),
			zstd.WithEncoderConcurrency(1), zstd.WithLowerEncoderMem(true))
		if err != nil {
			panic(fmt.Sprintf("block: zstd encoder: %v", err))
		}
		decoder, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0),
			zstd.WithDecoderMaxMemory(MaxRawBytes), zstd.WithDecoderLowmem(true), zstd.IgnoreChecksum(true))
		if err != nil {
			panic(fmt.Sprintf("block: zstd decoder: %v", err))
		}
	})
	return encoder, decoder
}

// uncompress returns the raw columns that follow the header, in new
// storage.
func uncompress(rest []byte) ([]byte, error) {
	return uncompressInto(nil, rest)
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

// decodeTimes fills the ticks of rs from the time column.
func decodeTimes(r *reader, h Header, rs []buckets.Reading, dev buckets.DeviceID) error {
	k, gap := h.Oldest, int64(0)
	rs[0] = buckets.Reading{Device: dev, Ticks: k}
	for i := 1; i < len(rs); i++ {
		dod := r.varint("time")
		g, overflow := addInt64(gap, dod)
		if r.err != nil || overflow || g <= 0 || g > int64(h.Newest-k) {
			return fmt.Errorf("%w: bad time column at reading %d", ErrCorrupt, i)
		}
		gap = g
		k += buckets.Ticks(g)
		rs[i] = buckets.Reading{Device: dev, Ticks: k}
	}
	if k != h.Newest {
		return fmt.Errorf("%w: times end at %d, header says %d", ErrCorrupt, k, h.Newest)
	}
	return nil
}

// addInt64 adds with overflow detection.
func addInt64(a, b int64) (int64, bool) {
	s := a + b
	return s, (a > 0 && b > 0 && s < 0) || (a < 0 && b < 0 && s >= 0)
}

// decodedColumn is one name's values, in reading order.
type decodedColumn struct {
	present []bool // nil: every reading
	values  []buckets.Value
}

// decodeColumn reads the column of in.
func decodeColumn(r *reader, in *NameInfo, n int) (decodedColumn, error) {
	var c decodedColumn
	if in.Count < n {
		c.present = readBitmap(r, n)
		if r.err != nil {
			return c, r.err
		}
		got := 0
		for _, p := range c.present {
			if p {
				got++
			}
		}
		if got != in.Count {
			return c, fmt.Errorf("%w: presence bitmap has %d values, header says %d", ErrCorrupt, got, in.Count)
		}
	}
	kinds, counts := readKinds(r, in)
	if r.err != nil {
		return c, r.err
	}
	floats := readFloats(r, counts[buckets.KindFloat])
	ints := readInts(r, counts[buckets.KindInt])
	bools := readBitmap(r, counts[buckets.KindBool])
	strs := readStrings(r, counts[buckets.KindString])
	if r.err != nil {
		return c, r.err
	}
	c.values = make([]buckets.Value, in.Count)
	numeric := int64(0)
	for i, k := range kinds {
		switch k {
		case buckets.KindFloat:
			c.values[i], floats = buckets.Float(floats[0]), floats[1:]
		case buckets.KindInt:
			c.values[i], ints = buckets.Int(ints[0]), ints[1:]
		case buckets.KindBool:
			c.values[i], bools = buckets.Bool(bools[0]), bools[1:]
		case buckets.KindString:
			c.values[i], strs = buckets.String(strs[0]), strs[1:]
			continue
		}
		numeric++
	}
	if numeric != in.Num.Count {
		return c, fmt.Errorf("%w: %d numeric values, header says %d", ErrCorrupt, numeric, in.Num.Count)
	}
	return c, nil
}

// readKinds returns the kind of each value of the column of in, and
// how many values each kind has.
func readKinds(r *reader, in *NameInfo) ([]buckets.Kind, map[buckets.Kind]int) {
	kinds := make([]buckets.Kind, in.Count)
	single := bits.OnesCount8(in.Kinds) == 1
	counts := map[buckets.Kind]int{}
	for i := range kinds {
		if single {
			kinds[i] = buckets.Kind(bits.TrailingZeros8(in.Kinds))
		} else {
			kinds[i] = buckets.Kind(r.byte("kind"))
			if in.Kinds&(1<<kinds[i]) == 0 || kinds[i] > buckets.KindString {
				r.fail("kind")
			}
		}
		counts[kinds[i]]++
	}
	return kinds, counts
}

// readBitmap reads n bits.
func readBitmap(r *reader, n int) []bool {
	if n == 0 {
		return nil
	}
	p := r.bytes(uint64((n+7)/8), "bitmap")
	if p == nil {
		return nil
	}
	bs := make([]bool, n)
	for i := range bs {
		bs[i] = p[i/8]&(1<<(i%8)) != 0
	}
	return bs
}

// readFloats reads a float column of n values.
func readFloats(r *reader, n int) []float64 {
	if n == 0 {
		return nil
	}
	return readFloatsInto(r, make([]float64, n))
}

// readFloatsInto reads a float column of len(fs) values into fs, which
// it returns (nil on failure).
func readFloatsInto(r *reader, fs []float64) []float64 {
	switch r.byte("float encoding") {
	case floatDecimal:
		e := int(r.byte("exponent"))
		if e > maxDecimals {
			r.fail("exponent")
			return nil
		}
		var m int64
		for i := range fs {
			m += r.fastVarint("decimal")
			fs[i] = float64(m) / pow10[e]
		}
	case floatXOR:
		var prev uint64
		for i := range fs {
			p := r.bytes(8, "xor")
			if p == nil {
				return nil
			}
			prev ^= binary.LittleEndian.Uint64(p)
			fs[i] = math.Float64frombits(prev)
		}
	default:
		r.fail("float encoding")
	}
	return fs
}

// readInts reads an int column of n values.
func readInts(r *reader, n int) []int64 {
	if n == 0 {
		return nil
	}
	return readIntsInto(r, make([]int64, n))
}

// readIntsInto reads an int column of len(is) values into is.
func readIntsInto(r *reader, is []int64) []int64 {
	var prev int64
	for i := range is {
		prev += r.fastVarint("int")
		is[i] = prev
	}
	return is
}

// readStrings reads a string column of n values.
func readStrings(r *reader, n int) []string {
	if n == 0 {
		return nil
	}
	size := r.uvarint("dictionary size")
	if size == 0 || size > uint64(n) {
		r.fail("dictionary size")
		return nil
	}
	dict := make([]string, size)
	for i := range dict {
		l := r.uvarint("string length")
		if l > buckets.MaxStringLen {
			r.fail("string length")
			return nil
		}
		dict[i] = strings.Clone(string(r.bytes(l, "string")))
	}
	strs := make([]string, n)
	for i := range strs {
		if size == 1 {
			strs[i] = dict[0]
			continue
		}
		j := r.uvarint("string index")
		if j >= size {
			r.fail("string index")
			return nil
		}
		strs[i] = dict[j]
	}
	return strs
}

// EachSummary calls fn with every value name of the block b that has
// numeric values and the summary of those values, reading the header
// only (after checking the checksum of the whole block, so that a
// damaged block makes no call) and allocating nothing: name is only
// valid during the call. It returns the block's oldest and newest
// ticks.
func EachSummary(b []byte, fn func(name []byte, s buckets.Summary)) (oldest, newest buckets.Ticks, err error) {
	if b, err = body(b); err != nil {
		return 0, 0, err
	}
	r := reader{b: b}
	n, o, span, names := r.uvarint("count"), r.uvarint("oldest"), r.uvarint("span"), r.uvarint("names")
	if r.err != nil || n == 0 || n > MaxReadings || names == 0 || names > MaxNames ||
		o > uint64(buckets.MaxTicks) || span > uint64(buckets.MaxTicks)-o {
		return 0, 0, fmt.Errorf("%w: bad header", ErrCorrupt)
	}
	oldest, newest = buckets.Ticks(o), buckets.Ticks(o+span)
	for range names {
		name := r.bytes(r.uvarint("name length"), "name")
		r.byte("kinds")
		r.uvarint("name count")
		num := r.uvarint("numeric count")
		if r.err != nil {
			return 0, 0, r.err
		}
		if num == 0 {
			continue
		}
		s := buckets.Summary{Count: int64(num)}
		readSummary(&r, &s)
		ft, lt := r.uvarint("first ticks"), r.uvarint("last ticks")
		if r.err != nil || ft > span || lt > span {
			return 0, 0, fmt.Errorf("%w: bad summary", ErrCorrupt)
		}
		s.FirstTicks, s.LastTicks = oldest+buckets.Ticks(ft), oldest+buckets.Ticks(lt)
		fn(name, s)
	}
	return oldest, newest, nil
}
