package devindex

import (
	"encoding/hex"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// goldenValues are fields of every kind and edge value with the bytes
// AppendValues writes for each (hex: name length and name, then tag and
// payload). They are on disk in every device index record, so they
// must never change.
var goldenValues = []struct {
	field         buckets.Field
	name, payload string
}{
	{buckets.Field{Name: "zero", Value: buckets.Float(0)}, "047a65726f", "0600"},
	{buckets.Field{Name: "negative zero", Value: buckets.Float(math.Copysign(0, -1))}, "0d6e65676174697665207a65726f", "010000000000000080"},
	{buckets.Field{Name: "NaN", Value: buckets.Float(math.NaN())}, "034e614e", "01010000000000f87f"},
	{buckets.Field{Name: "NaN payload", Value: buckets.Float(math.Float64frombits(0xfff0_0000_0000_0abc))}, "0b4e614e207061796c6f6164", "01bc0a00000000f0ff"},
	{buckets.Field{Name: "+Inf", Value: buckets.Float(math.Inf(1))}, "042b496e66", "01000000000000f07f"},
	{buckets.Field{Name: "-Inf", Value: buckets.Float(math.Inf(-1))}, "042d496e66", "01000000000000f0ff"},
	{buckets.Field{Name: "whole", Value: buckets.Float(21)}, "0577686f6c65", "062a"},
	{buckets.Field{Name: "negative whole", Value: buckets.Float(-1000)}, "0e6e656761746976652077686f6c65", "06cf0f"},
	{buckets.Field{Name: "fraction", Value: buckets.Float(21.5)}, "086672616374696f6e", "010000000000803540"},
	{buckets.Field{Name: "2^53", Value: buckets.Float(1 << 53)}, "04325e3533", "068080808080808020"},
	{buckets.Field{Name: "-2^53", Value: buckets.Float(-(1 << 53))}, "052d325e3533", "06ffffffffffffff1f"},
	{buckets.Field{Name: "2^53+2", Value: buckets.Float(1<<53 + 2)}, "06325e35332b32", "010100000000004043"},
	{buckets.Field{Name: "max float", Value: buckets.Float(math.MaxFloat64)}, "096d617820666c6f6174", "01ffffffffffffef7f"},
	{buckets.Field{Name: "smallest denormal", Value: buckets.Float(math.SmallestNonzeroFloat64)}, "11736d616c6c6573742064656e6f726d616c", "010100000000000000"},
	{buckets.Field{Name: "int zero", Value: buckets.Int(0)}, "08696e74207a65726f", "0200"},
	{buckets.Field{Name: "int -1", Value: buckets.Int(-1)}, "06696e74202d31", "0201"},
	{buckets.Field{Name: "int min", Value: buckets.Int(math.MinInt64)}, "07696e74206d696e", "02ffffffffffffffffff01"},
	{buckets.Field{Name: "int max", Value: buckets.Int(math.MaxInt64)}, "07696e74206d6178", "02feffffffffffffffff01"},
	{buckets.Field{Name: "true", Value: buckets.Bool(true)}, "0474727565", "04"},
	{buckets.Field{Name: "false", Value: buckets.Bool(false)}, "0566616c7365", "03"},
	{buckets.Field{Name: "empty string", Value: buckets.String("")}, "0c656d70747920737472696e67", "0500"},
	{buckets.Field{Name: "utf-8", Value: buckets.String("température °C")}, "057574662d38", "051074656d70c3a972617475726520c2b043"},
	{buckets.Field{Name: "long string", Value: buckets.String(strings.Repeat("0123456789", 30))}, "0b6c6f6e6720737472696e67", "05ac02" + strings.Repeat("30313233343536373839", 30)},
	{buckets.Field{Name: "", Value: buckets.Int(1)}, "00", "0202"},
	{buckets.Field{Name: strings.Repeat("n", 130), Value: buckets.Bool(true)}, "8201" + strings.Repeat("6e", 130), "04"},
}

// TestIndexValuesGolden pins the bytes of the values layout: each field
// alone, all of them in one record (version 1, uvarint count 25), and
// the decoding of those bytes back to the same fields, float bits and
// all.
func TestIndexValuesGolden(t *testing.T) {
	var fields []buckets.Field
	want := "0119"
	for _, g := range goldenValues {
		one := "0101" + g.name + g.payload
		assert.Equal(t, one, hex.EncodeToString(AppendValues(nil, []buckets.Field{g.field})), "%q", g.field.Name)
		fields = append(fields, g.field)
		want += g.name + g.payload
	}
	require.Len(t, fields, 0x19)
	assert.Equal(t, want, hex.EncodeToString(AppendValues(nil, fields)))
	assert.Equal(t, "0100", hex.EncodeToString(AppendValues(nil, nil)))

	b, err := hex.DecodeString(want)
	require.NoError(t, err)
	got, err := decodeValues(b)
	require.NoError(t, err)
	assert.Equal(t, fields, got) // Value compares float bits: NaN payloads and -0 included
}

// TestIndexDecodeValuesErrorText pins what a corrupt values record is
// called: the text goes into the logs and errors of the device index.
func TestIndexDecodeValuesErrorText(t *testing.T) {
	tests := map[string]string{
		"":                 "corrupt value encoding: unknown version",
		"02":               "corrupt value encoding: unknown version",
		"01":               "corrupt value encoding: bad field count",
		"0102":             "corrupt value encoding: bad field count",
		"010101":           "corrupt value encoding: truncated or trailing bytes",
		"010101780700":     "corrupt value encoding: truncated or trailing bytes",
		"01010178040000":   "corrupt value encoding: truncated or trailing bytes",
		"0101017801000000": "corrupt value encoding: truncated or trailing bytes",
	}
	for in, want := range tests {
		b, err := hex.DecodeString(in)
		require.NoError(t, err)
		_, err = decodeValues(b)
		assert.EqualError(t, err, want, in)
		assert.ErrorIs(t, err, errCorruptValues, in)
	}
}
