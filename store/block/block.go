// Package block encodes the readings of one device as a compressed,
// self-describing block: the unit in which the store keeps a device's
// series inside a day table.
//
// A block starts with a header that can be read without decompressing
// anything else: the number of readings, the oldest and newest ticks,
// and per value name the kinds seen, how many readings carry it and a
// summary of its numeric values (count, sum, min, max, first, last).
// Queries that only need those summaries (aggregates over buckets that
// contain the whole block) read the header alone.
//
// The readings follow column by column, then a general compressor
// (zstd) over all columns:
//
//   - times: the first gap, then delta-of-delta as zigzag varints, so a
//     device reporting at a steady rate costs about one byte per reading
//     before compression and almost nothing after;
//   - floats: when every value of the column is a decimal with at most
//     maxDecimals digits after the point, the scaled integers as
//     zigzag-varint deltas; otherwise each value XORed with the one
//     before (8 bytes; the leading zero bytes are left to zstd);
//   - ints: zigzag-varint deltas;
//   - bools: a bitmap;
//   - strings: a dictionary of the distinct strings, then one index per
//     value.
//
// A name that not every reading carries has a presence bitmap, and a
// name whose values have several kinds has one kind byte per value.
// BENCHMARKS.md records the measurements behind these choices.
//
// A CRC-32C of all the bytes before it ends the block, and every reader
// checks it before it interprets anything else, so a damaged block is
// reported as ErrChecksum instead of decoding into wrong values.
// FORMAT.md draws the layout byte by byte.
package block

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/bits"
	"slices"
	"strings"

	"github.com/telemetryd/telemetryd/buckets"
)

// Version is the block format version this package writes and reads:
// the body followed by a CRC-32C of everything before it (FORMAT.md
// draws it).
const Version = 5

// checksumLen is the length of the checksum that ends a block.
const checksumLen = 4

// castagnoli is the CRC-32C table; hash/crc32 uses the CPU's CRC32
// instruction for it where there is one.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Limits of a block. Decode refuses anything beyond them, so damaged or
// hostile bytes can never make it allocate without bound.
const (
	// MaxReadings is the most readings one block holds.
	MaxReadings = 8192
	// MaxFields is the most values (over all readings) one block holds.
	MaxFields = 1 << 20
	// MaxNames is the most distinct value names one block holds.
	MaxNames = 4 * buckets.MaxValues
	// MaxRawBytes bounds the uncompressed columns of one block.
	MaxRawBytes = 64 << 20
)

// maxDecimals is the most digits after the decimal point that the
// scaled-decimal float encoding handles; other columns use XOR.
const maxDecimals = 9

// minCompress is the smallest column size worth handing to zstd: below
// it (a commit's block of one or two readings) the frame overhead eats
// the gain and the call costs more than the rest of the encoding.
const minCompress = 128

// Compression of the columns.
const (
	compressNone = 0
	compressZstd = 1
)

// Float column encodings.
const (
	floatDecimal = 0
	floatXOR     = 1
)

// ErrCorrupt is wrapped by every decoding error.
var ErrCorrupt = errors.New("corrupt block")

// ErrChecksum is wrapped by the error of a block whose bytes do not
// match its checksum. It wraps ErrCorrupt.
var ErrChecksum = fmt.Errorf("%w: checksum mismatch", ErrCorrupt)

// ErrVersion is wrapped by the error of a block of an unknown version.
var ErrVersion = errors.New("unknown block format version")

// NameInfo is what a header knows of one value name.
type NameInfo struct {
	Name string
	// Kinds has bit 1<<k set for every buckets.Kind k seen.
	Kinds uint8
	// Count is how many readings carry the name.
	Count int
	// Num summarises the numeric values (floats, ints, bools as 0/1);
	// Num.Count is 0 when the name only held strings.
	Num buckets.Summary
}

// Header is the part of a block that is read without decompressing.
type Header struct {
	Count          int
	Oldest, Newest buckets.Ticks
	Names          []NameInfo // sorted by name
}

// Encode appends the block of rs to dst. The readings must be of one
// device, sorted by strictly increasing ticks, each with at least one
// value and its values sorted by unique names (as buckets.Reading
// Validate requires); their Device is not stored. It fails when rs is
// empty, unsorted or beyond the limits of a block.
func Encode(dst []byte, rs []buckets.Reading) ([]byte, error) {
	return encode(dst, rs, encoding{})
}

// EncodePlain is Encode with the columns left uncompressed: for blocks
// that are merged into others soon, whose zstd work would be thrown
// away (readers decode both alike).
func EncodePlain(dst []byte, rs []buckets.Reading) ([]byte, error) {
	return encode(dst, rs, encoding{noZstd: true})
}

// encoding turns off choices of the format, to measure what each is
// worth (the decoder reads every such block).
type encoding struct {
	noZstd  bool // leave the columns uncompressed
	xorOnly bool // XOR every float column, never scaled decimals
}

func encode(dst []byte, rs []buckets.Reading, e encoding) ([]byte, error) {
	if len(rs) == 0 || len(rs) > MaxReadings {
		return dst, fmt.Errorf("encode block: %d readings (want 1..%d)", len(rs), MaxReadings)
	}
	cols, err := columnsOf(rs)
	if err != nil {
		return dst, err
	}
	total := 0
	for i := range cols {
		total += cols[i].info.Count
	}
	if total > MaxFields {
		return dst, fmt.Errorf("encode block: %d values is more than %d", total, MaxFields)
	}
	raw := appendTimes(nil, rs)
	for i := range cols {
		raw = cols[i].appendTo(raw, len(rs), e.xorOnly)
	}
	if len(raw) > MaxRawBytes {
		return dst, fmt.Errorf("encode block: %d bytes of columns is more than %d", len(raw), MaxRawBytes)
	}
	start := len(dst)
	dst = appendHeader(dst, rs, cols)
	dst = appendColumns(dst, raw, e.noZstd)
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli)), nil
}

// appendColumns appends the compression byte, the size of the raw
// columns and the columns, compressed when that makes them smaller.
func appendColumns(dst, raw []byte, noZstd bool) []byte {
	if len(raw) >= minCompress && !noZstd {
		enc, _ := codecs()
		packed := enc.EncodeAll(raw, nil)
		if len(packed) < len(raw) {
			dst = append(dst, compressZstd)
			dst = binary.AppendUvarint(dst, uint64(len(raw)))
			return append(dst, packed...)
		}
	}
	dst = append(dst, compressNone)
	dst = binary.AppendUvarint(dst, uint64(len(raw)))
	return append(dst, raw...)
}

// column gathers the values of one name.
type column struct {
	info    NameInfo
	present []bool // per reading
	values  []buckets.Value
}

// columnsOf splits rs into one column per name, sorted by name.
// Readings of a device mostly carry the same names in the same order,
// so the column of a reading's k-th value is first looked for where
// the previous reading's k-th value went; the map is the fallback.
// Long: one pass that checks and gathers every value; split, the
// checks would need a second walk over every value.
func columnsOf(rs []buckets.Reading) ([]column, error) {
	index := make(map[string]int)
	var cols []column
	var hint []int // column of the previous reading's k-th value
	for i := range rs {
		r := &rs[i]
		if i > 0 && r.Ticks <= rs[i-1].Ticks {
			return nil, fmt.Errorf("encode block: ticks not strictly increasing at reading %d", i)
		}
		if len(r.Values) == 0 {
			return nil, fmt.Errorf("encode block: reading %d has no values", i)
		}
		for k, f := range r.Values {
			j := -1
			if k < len(hint) && cols[hint[k]].info.Name == f.Name {
				j = hint[k]
			} else if at, ok := index[f.Name]; ok {
				j = at
			} else {
				if len(cols) == MaxNames {
					return nil, fmt.Errorf("encode block: more than %d value names", MaxNames)
				}
				j = len(cols)
				index[f.Name] = j
				cols = append(cols, column{info: NameInfo{Name: f.Name}, present: make([]bool, len(rs)),
					values: make([]buckets.Value, 0, len(rs)-i)})
			}
			if k < len(hint) {
				hint[k] = j
			} else {
				hint = append(hint, j)
			}
			c := &cols[j]
			if c.present[i] {
				return nil, fmt.Errorf("encode block: reading %d has value %q twice", i, f.Name)
			}
			if f.Value.Kind < buckets.KindFloat || f.Value.Kind > buckets.KindString {
				return nil, fmt.Errorf("encode block: reading %d value %q has unknown kind %d", i, f.Name, f.Value.Kind)
			}
			c.present[i] = true
			c.values = append(c.values, f.Value)
			c.info.Kinds |= 1 << f.Value.Kind
			c.info.Count++
			if x, ok := buckets.Numeric(f.Value); ok {
				c.info.Num.Add(r.Ticks, x)
			}
		}
	}
	slices.SortFunc(cols, func(a, b column) int { return strings.Compare(a.info.Name, b.info.Name) })
	return cols, nil
}

// appendHeader appends the version and the header.
func appendHeader(dst []byte, rs []buckets.Reading, cols []column) []byte {
	oldest, newest := rs[0].Ticks, rs[len(rs)-1].Ticks
	dst = append(dst, Version)
	dst = binary.AppendUvarint(dst, uint64(len(rs)))
	dst = binary.AppendUvarint(dst, uint64(oldest))
	dst = binary.AppendUvarint(dst, uint64(newest-oldest))
	dst = binary.AppendUvarint(dst, uint64(len(cols)))
	for i := range cols {
		in := &cols[i].info
		dst = binary.AppendUvarint(dst, uint64(len(in.Name)))
		dst = append(dst, in.Name...)
		dst = append(dst, in.Kinds)
		dst = binary.AppendUvarint(dst, uint64(in.Count))
		dst = binary.AppendUvarint(dst, uint64(in.Num.Count))
		if in.Num.Count == 0 {
			continue
		}
		dst = appendSummary(dst, &cols[i])
		dst = binary.AppendUvarint(dst, uint64(in.Num.FirstTicks-oldest))
		dst = binary.AppendUvarint(dst, uint64(in.Num.LastTicks-oldest))
	}
	return dst
}

// appendSummary appends the numbers of a name's summary: when every
// numeric value of the column is a scaled decimal of exponent e, the
// byte e+1 and min, max, first, last and the exact sum as zigzag-varint
// scaled integers (a few bytes each); otherwise 0 and five float64s.
func appendSummary(dst []byte, c *column) []byte {
	s := &c.info.Num
	nums := make([]float64, 0, len(c.values))
	for _, v := range c.values {
		if x, ok := buckets.Numeric(v); ok {
			nums = append(nums, x)
		}
	}
	if e := decimalExponent(nums); e >= 0 {
		var sum int64
		exact := true
		for _, x := range nums {
			m, _ := scaled(x, e)
			var overflow bool
			if sum, overflow = addInt64(sum, m); overflow {
				exact = false
				break
			}
		}
		if exact {
			dst = append(dst, byte(e+1))
			for _, x := range [...]float64{s.Min, s.Max, s.First, s.Last} {
				m, _ := scaled(x, e)
				dst = binary.AppendVarint(dst, m)
			}
			return binary.AppendVarint(dst, sum)
		}
	}
	dst = append(dst, 0)
	for _, f := range [...]float64{s.Sum, s.Min, s.Max, s.First, s.Last} {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(f))
	}
	return dst
}

// appendTimes appends the time column: the first gap, then the change
// of each gap (delta-of-delta).
func appendTimes(dst []byte, rs []buckets.Reading) []byte {
	var prevGap int64
	for i := 1; i < len(rs); i++ {
		gap := int64(rs[i].Ticks - rs[i-1].Ticks)
		dst = binary.AppendVarint(dst, gap-prevGap)
		prevGap = gap
	}
	return dst
}

// appendTo appends the column's presence, kinds and values.
func (c *column) appendTo(dst []byte, n int, xorOnly bool) []byte {
	if c.info.Count < n {
		dst = appendBitmap(dst, c.present)
	}
	if bits.OnesCount8(c.info.Kinds) > 1 {
		for _, v := range c.values {
			dst = append(dst, byte(v.Kind))
		}
	}
	var floats []float64
	var ints []int64
	var bools []bool
	var strs []string
	for _, v := range c.values {
		switch v.Kind {
		case buckets.KindFloat:
			floats = append(floats, v.AsFloat())
		case buckets.KindInt:
			ints = append(ints, v.AsInt())
		case buckets.KindBool:
			bools = append(bools, v.AsBool())
		case buckets.KindString:
			strs = append(strs, v.AsString())
		}
	}
	if len(floats) > 0 {
		dst = appendFloats(dst, floats, xorOnly)
	}
	var prev int64
	for _, x := range ints {
		dst = binary.AppendVarint(dst, x-prev) // wraps; decoding wraps back
		prev = x
	}
	if len(bools) > 0 {
		dst = appendBitmap(dst, bools)
	}
	if len(strs) > 0 {
		dst = appendStrings(dst, strs)
	}
	return dst
}

// appendBitmap appends bs as bits, least significant first.
func appendBitmap(dst []byte, bs []bool) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, (len(bs)+7)/8)...)
	for i, b := range bs {
		if b {
			dst[start+i/8] |= 1 << (i % 8)
		}
	}
	return dst
}

// pow10 holds the exact powers of ten used for scaled decimals.
var pow10 = [...]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9}

// decimalExponent returns the smallest e such that every value is
// exactly m / 10^e for an integer m of at most 2^53 in magnitude (the
// decode expression is checked bit for bit), or -1.
func decimalExponent(fs []float64) int {
	e := 0
	for _, f := range fs {
		for ; e <= maxDecimals; e++ {
			if _, ok := scaled(f, e); ok {
				break
			}
		}
		if e > maxDecimals {
			return -1
		}
	}
	for _, f := range fs { // a larger e chosen later must hold for all
		if _, ok := scaled(f, e); !ok {
			return -1
		}
	}
	return e
}

// scaled returns m with m / 10^e == f exactly.
func scaled(f float64, e int) (int64, bool) {
	m := math.Round(f * pow10[e])
	if math.Abs(m) > 1<<53 || math.IsNaN(m) {
		return 0, false
	}
	if math.Float64bits(float64(int64(m))/pow10[e]) != math.Float64bits(f) {
		return 0, false
	}
	return int64(m), true
}

// appendFloats appends a float column as scaled decimals or XOR.
func appendFloats(dst []byte, fs []float64, xorOnly bool) []byte {
	if e := decimalExponent(fs); e >= 0 && !xorOnly {
		dst = append(dst, floatDecimal, byte(e))
		var prev int64
		for _, f := range fs {
			m, _ := scaled(f, e)
			dst = binary.AppendVarint(dst, m-prev)
			prev = m
		}
		return dst
	}
	dst = append(dst, floatXOR)
	var prev uint64
	for _, f := range fs {
		b := math.Float64bits(f)
		dst = binary.LittleEndian.AppendUint64(dst, b^prev)
		prev = b
	}
	return dst
}

// appendStrings appends a dictionary and the index of every value.
func appendStrings(dst []byte, strs []string) []byte {
	index := make(map[string]uint64)
	var dict []string
	for _, s := range strs {
		if _, ok := index[s]; !ok {
			index[s] = uint64(len(dict))
			dict = append(dict, s)
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(dict)))
	for _, s := range dict {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	if len(dict) > 1 {
		for _, s := range strs {
			dst = binary.AppendUvarint(dst, index[s])
		}
	}
	return dst
}
