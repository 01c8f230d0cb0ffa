package rollup

import (
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// goldenLevel, goldenStart and goldenBuckets make goldenRecord: three
// buckets of a one-minute level (60 a record) with edge values in every
// float (NaN with and without a payload, ±Inf, -0, the largest and the
// smallest), the largest count, an empty and a 130-byte name, and
// offsets of one and five bytes.
var (
	goldenLevel = Level{Interval: time.Minute, Retention: Day}
	goldenStart = WindowStart(buckets.MustTicks(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)))
)

func goldenBuckets() []Bucket {
	ss, iv := goldenStart, goldenLevel.ticks()
	return []Bucket{
		{Start: ss, DistinctMs: true, Values: []buckets.NamedSummary{
			{Name: "", Summary: buckets.Summary{Count: 1, FirstTicks: ss, LastTicks: ss}},
			{Name: "a", Summary: buckets.Summary{Count: 2, Sum: math.NaN(), Min: math.Inf(-1), Max: math.Inf(1), First: math.Copysign(0, -1), Last: 1.5, FirstTicks: ss + 1, LastTicks: ss + iv - 1}},
		}},
		{Start: ss + iv, Values: []buckets.NamedSummary{
			{Name: "b", Summary: buckets.Summary{Count: math.MaxInt64, Sum: math.MaxFloat64, Min: -math.MaxFloat64, Max: math.SmallestNonzeroFloat64, First: math.Float64frombits(0xfff0_0000_0000_0abc), FirstTicks: ss + iv + 127, LastTicks: ss + iv + 128}},
			{Name: strings.Repeat("n", 130), Summary: buckets.Summary{Count: 128, Sum: 21, Min: -1000, Max: 1 << 53, First: 21.5, Last: -1, FirstTicks: ss + iv, LastTicks: ss + 2*iv - 1}},
		}},
		{Start: ss + 59*iv, Values: []buckets.NamedSummary{
			{Name: "température", Summary: buckets.Summary{Count: 1, Sum: -0.1, Min: -0.1, Max: -0.1, First: -0.1, Last: -0.1, FirstTicks: ss + 59*iv + 5, LastTicks: ss + 59*iv + 5}},
		}},
	}
}

// goldenRecord is what appendRecord writes for goldenBuckets, in hex.
// Records are on disk, so these bytes must never change.
var goldenRecord = strings.Join([]string{
	"01", // version
	"03", // buckets
	// bucket 0: offset, flags (distinct ms), names
	"00", "01", "02",
	"00", "01", strings.Repeat("00", 40), "00", "00", // "": count, 5 floats, first, last
	"0161", "02", // "a"
	"010000000000f87f", "000000000000f0ff", "000000000000f07f", "0000000000000080", "000000000000f83f",
	"01", "ff8b8d9e02",
	// bucket 1
	"01", "00", "02",
	"0162", "ffffffffffffffff7f", // "b", count MaxInt64
	"ffffffffffffef7f", "ffffffffffffefff", "0100000000000000", "bc0a00000000f0ff", "0000000000000000",
	"7f", "8001",
	"8201" + strings.Repeat("6e", 130), "8001",
	"0000000000003540", "0000000000408fc0", "0000000000004043", "0000000000803540", "000000000000f0bf",
	"00", "ff8b8d9e02",
	// bucket 59
	"3b", "00", "01",
	"0c74656d70c3a9726174757265", "01", strings.Repeat("9a9999999999b9bf", 5), "05", "05",
	"96e1be49", // CRC-32C
}, "")

// summaryBits is a summary with its floats as bits, so NaN compares
// equal to itself and -0 differs from 0.
type summaryBits struct {
	count, firstTicks, lastTicks int64
	floats                       [5]uint64
}

func bitsOf(bs []Bucket) [][]any {
	var out [][]any
	for _, b := range bs {
		row := []any{b.Start, b.DistinctMs}
		for _, v := range b.Values {
			s := v.Summary
			row = append(row, v.Name, summaryBits{s.Count, int64(s.FirstTicks), int64(s.LastTicks), [5]uint64{
				math.Float64bits(s.Sum), math.Float64bits(s.Min), math.Float64bits(s.Max), math.Float64bits(s.First), math.Float64bits(s.Last)}})
		}
		out = append(out, row)
	}
	return out
}

// TestRecordGolden pins the bytes of a record and their decoding.
func TestRecordGolden(t *testing.T) {
	iv := goldenLevel.ticks()
	assert.Equal(t, goldenRecord, hex.EncodeToString(appendRecord(nil, goldenStart, iv, goldenBuckets())))

	b, err := hex.DecodeString(goldenRecord)
	require.NoError(t, err)
	var got []Bucket
	require.NoError(t, decodeRecord(b, goldenStart, iv, goldenLevel.span(), &decoder{}, func(b Bucket) error { got = append(got, b); return nil }))
	assert.Equal(t, bitsOf(goldenBuckets()), bitsOf(got))
}

// TestRecordErrorText pins what each kind of corrupt record is called.
func TestRecordErrorText(t *testing.T) {
	// withCRC appends the checksum to a record's hex body.
	withCRC := func(body string) []byte {
		b, err := hex.DecodeString(body)
		require.NoError(t, err)
		return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
	}
	one := "0161" + "01" + strings.Repeat("00", 40) + "0000" // "a", count 1, zeros, offsets 0
	tests := map[string]struct {
		in   []byte
		want string
	}{
		"empty":               {nil, "bad version or length"},
		"version 2":           {withCRC("02"), "bad version or length"},
		"too short":           {[]byte{1, 0, 0, 0}, "bad version or length"},
		"checksum":            {append(withCRC("0100")[:2], 0, 0, 0, 0), "checksum mismatch"},
		"61 buckets":          {withCRC("013d"), "61 buckets"},
		"offset past span":    {withCRC("01013c0001" + one), "bad bucket offset"},
		"offsets not rising":  {withCRC("0102050001" + one + "050001" + one), "bad bucket offset"},
		"no names":            {withCRC("0101000000"), "bad name count"},
		"too many names":      {withCRC("01010000818004"), "bad name count"},
		"count 0":             {withCRC("0101000001" + "0161" + "00" + strings.Repeat("00", 40) + "0000"), "bad summary"},
		"first past interval": {withCRC("0101000001" + "0161" + "01" + strings.Repeat("00", 40) + "808c8d9e0200"), "bad summary"},
		"floats cut short":    {withCRC("0101000001" + "0161" + "01" + strings.Repeat("00", 39)), "bad summary"},
		"trailing bytes":      {withCRC("0101000001" + one + "0000"), "2 trailing bytes"},
	}
	iv := goldenLevel.ticks()
	for name, tc := range tests {
		err := decodeRecord(tc.in, goldenStart, iv, goldenLevel.span(), &decoder{}, func(Bucket) error { return nil })
		assert.EqualError(t, err, "corrupt rollup record: "+tc.want, name)
		assert.ErrorIs(t, err, ErrCorrupt, name)
	}
}
