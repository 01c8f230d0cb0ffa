package devindex

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// valueCases covers every kind and the edges of the float encoding.
var valueCases = map[string]buckets.Value{
	"zero":                  buckets.Float(0),
	"negative zero":         buckets.Float(math.Copysign(0, -1)),
	"whole float":           buckets.Float(21),
	"fraction":              buckets.Float(21.5),
	"negative whole":        buckets.Float(-40),
	"2^53":                  buckets.Float(1 << 53),
	"-2^53":                 buckets.Float(-(1 << 53)),
	"2^53+2":                buckets.Float(1<<53 + 2),
	"-(2^53+2)":             buckets.Float(-(1<<53 + 2)),
	"2^63":                  buckets.Float(math.Ldexp(1, 63)),
	"-2^63":                 buckets.Float(-math.Ldexp(1, 63)),
	"1e300":                 buckets.Float(1e300),
	"max float":             buckets.Float(math.MaxFloat64),
	"lowest float":          buckets.Float(-math.MaxFloat64),
	"smallest denormal":     buckets.Float(math.SmallestNonzeroFloat64),
	"NaN bits survive":      buckets.Float(math.NaN()),
	"+Inf survives":         buckets.Float(math.Inf(1)),
	"int zero":              buckets.Int(0),
	"int min":               buckets.Int(math.MinInt64),
	"int max":               buckets.Int(math.MaxInt64),
	"int 2^53+1":            buckets.Int(1<<53 + 1),
	"int -1":                buckets.Int(-1),
	"true":                  buckets.Bool(true),
	"false":                 buckets.Bool(false),
	"empty string":          buckets.String(""),
	"string with NULs":      buckets.String("a\x00b\x00\x00"),
	"string of 4096 bytes":  buckets.String(strings.Repeat("\xff", 4096)),
	"utf-8 string":          buckets.String("température °C"),
	"string of the version": buckets.String("\x01"),
}

func TestIndexValuesRoundTripEachKind(t *testing.T) {
	for name, v := range valueCases {
		t.Run(name, func(t *testing.T) {
			in := []buckets.Field{{Name: "x", Value: v}}
			out, err := decodeValues(AppendValues(nil, in))
			require.NoError(t, err)
			require.Len(t, out, 1)
			assert.Equal(t, in, out)
			assert.Equal(t, v.Kind, out[0].Value.Kind)
			if v.Kind == buckets.KindFloat {
				assert.Equal(t, math.Float64bits(v.AsFloat()), math.Float64bits(out[0].Value.AsFloat()), "float bits")
			}
		})
	}
}

func TestIndexValuesRoundTripMany(t *testing.T) {
	var in []buckets.Field
	for name, v := range valueCases {
		in = append(in, buckets.Field{Name: strings.ReplaceAll(name, " ", "_"), Value: v})
	}
	_, ok := buckets.SortValues(in)
	require.True(t, ok)
	in = append(in, floatFields(200)...)
	buckets.SortValues(in)

	enc := AppendValues([]byte("keep"), in)
	require.Equal(t, []byte("keep"), enc[:4], "AppendValues appends")
	out, err := decodeValues(enc[4:])
	require.NoError(t, err)
	assert.Equal(t, in, out)

	empty, err := decodeValues(AppendValues(nil, nil))
	require.NoError(t, err)
	assert.Empty(t, empty)
}

// TestValuesFloatEncoding checks the documented tags: whole floats of at
// most 2^53 in magnitude take the short varint form (tag 6); -0 and
// anything else keep all 8 bytes (tag 1).
func TestIndexValuesFloatEncoding(t *testing.T) {
	const tagFloat, tagFloatInt = 1, 6
	tests := []struct {
		v       float64
		tag     byte
		payload int
	}{
		{0, tagFloatInt, 1},
		{21, tagFloatInt, 1},
		{-1000, tagFloatInt, 2},
		{1 << 53, tagFloatInt, 8},
		{-(1 << 53), tagFloatInt, 8},
		{1<<53 + 2, tagFloat, 8},
		{math.Copysign(0, -1), tagFloat, 8},
		{0.5, tagFloat, 8},
		{math.Ldexp(1, 63), tagFloat, 8},
		{-math.Ldexp(1, 63), tagFloat, 8},
		{1e300, tagFloat, 8},
	}
	for _, tc := range tests {
		enc := AppendValues(nil, []buckets.Field{{Name: "x", Value: buckets.Float(tc.v)}})
		// version, count, name length, name, tag, payload
		require.Len(t, enc, 5+tc.payload, "%g", tc.v)
		assert.Equal(t, []byte{1, 1, 1, 'x'}, enc[:4])
		assert.Equal(t, tc.tag, enc[4], "tag of %g", tc.v)
	}
}

func TestIndexDecodeValuesRejects(t *testing.T) {
	valid := AppendValues(nil, []buckets.Field{
		{Name: "a", Value: buckets.Float(1.5)},
		{Name: "b", Value: buckets.String("hello")},
		{Name: "c", Value: buckets.Int(-300)},
		{Name: "d", Value: buckets.Bool(true)},
		{Name: "e", Value: buckets.Float(7)},
	})
	tests := map[string][]byte{
		"nil":                     nil,
		"empty":                   {},
		"version 0":               {0, 0},
		"version 2":               {2, 0},
		"version only":            {1},
		"count without fields":    {1, 1},
		"count past the input":    {1, 5, 1, 'x', 3},
		"huge count":              {1, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"count overflows uvarint": {1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"unknown tag 0":           {1, 1, 1, 'x', 0},
		"unknown tag 7":           {1, 1, 1, 'x', 7},
		"name longer than input":  {1, 1, 200, 'x', 3},
		"name length overflows":   {1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 3},
		"string longer than rest": {1, 1, 1, 'x', 5, 10, 'a'},
		"string length huge":      {1, 1, 1, 'x', 5, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
		"float cut short":         {1, 1, 1, 'x', 1, 0, 0, 0},
		"int varint unterminated": {1, 1, 1, 'x', 2, 0x80},
		"missing tag":             {1, 1, 1, 'x'},
		"trailing byte":           append(append([]byte(nil), valid...), 0),
		"two fields, count one":   {1, 1, 1, 'x', 3, 1, 'y', 4},
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			var out []buckets.Field
			var err error
			require.NotPanics(t, func() { out, err = decodeValues(in) })
			require.Error(t, err)
			assert.Contains(t, err.Error(), "corrupt value encoding")
			assert.Nil(t, out)
		})
	}

	// Every strict prefix of a valid encoding is truncated.
	for n := range len(valid) {
		_, err := decodeValues(valid[:n])
		assert.Error(t, err, "prefix of %d bytes", n)
	}
	_, err := decodeValues(valid)
	require.NoError(t, err)
}

func TestIndexAppendValuesPanicsOnUnknownKind(t *testing.T) {
	assert.Panics(t, func() { AppendValues(nil, []buckets.Field{{Name: "x"}}) })
}

// TestDecodeValuesFieldCountLimit: the decoder accepts up to 4*MaxValues
// fields (room for merged readings) and refuses one more.
func TestIndexDecodeValuesFieldCountLimit(t *testing.T) {
	encode := func(n int) []byte {
		b := binary.AppendUvarint([]byte{1}, uint64(n))
		return append(b, bytes.Repeat([]byte{1, 'x', 3}, n)...)
	}
	out, err := decodeValues(encode(4 * buckets.MaxValues))
	require.NoError(t, err)
	assert.Len(t, out, 4*buckets.MaxValues)
	_, err = decodeValues(encode(4*buckets.MaxValues + 1))
	assert.ErrorContains(t, err, "bad field count")
}

// FuzzIndexValueCodec checks that DecodeValues never panics on arbitrary
// bytes, and that whatever it decodes encodes and decodes back to the
// same fields, with a stable encoding.
//
//	go test -fuzz=FuzzIndexValueCodec ./store
func FuzzIndexValueCodec(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 0})
	f.Add(AppendValues(nil, []buckets.Field{
		{Name: "a", Value: buckets.Float(1.5)},
		{Name: "b", Value: buckets.String("x\x00y")},
		{Name: "c", Value: buckets.Int(math.MinInt64)},
		{Name: "d", Value: buckets.Bool(true)},
		{Name: "e", Value: buckets.Float(1 << 53)},
	}))
	f.Add(binary.AppendVarint([]byte{1, 1, 1, 'x', 6}, math.MaxInt64)) // non-canonical float
	f.Fuzz(func(t *testing.T, data []byte) {
		fields, err := decodeValues(data)
		if err != nil {
			require.Nil(t, fields)
			return
		}
		enc := AppendValues(nil, fields)
		again, err := decodeValues(enc)
		require.NoError(t, err)
		require.Len(t, again, len(fields))
		if len(fields) > 0 {
			// DeepEqual on Value compares float bits: -0 stays -0.
			assert.Equal(t, fields, again)
		}
		require.Equal(t, enc, AppendValues(nil, again), "encoding is stable")
		require.LessOrEqual(t, len(enc), len(data), "the canonical encoding is never longer")
	})
}

// floatFields returns n float fields named v000, v001, ... (sorted).
func floatFields(n int) []buckets.Field {
	out := make([]buckets.Field, n)
	for i := range out {
		out[i] = buckets.Field{Name: fmt.Sprintf("v%03d", i), Value: buckets.Float(float64(i))}
	}
	return out
}
