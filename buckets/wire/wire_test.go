package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

const device = buckets.DeviceID("dev-1")

// base is a valid tick count (2026-11-22).
const base = buckets.Ticks(639_000_000_000_000_000)

func encode(rs []buckets.Reading) []byte {
	var e Encoder
	e.Reset()
	for _, r := range rs {
		e.Add(r.Ticks, r.Values)
	}
	return e.Append(nil)
}

func sampleReadings() []buckets.Reading {
	return []buckets.Reading{
		{Device: device, Ticks: base + 10, Values: []buckets.Field{
			{Name: "env.b", Value: buckets.Bool(true)},
			{Name: "env.hum", Value: buckets.Int(-42)},
			{Name: "env.site", Value: buckets.String("hall \"7\"\n\x00é")},
			{Name: "env.temp", Value: buckets.Float(21.25)},
		}},
		{Device: device, Ticks: base, Values: []buckets.Field{ // earlier: a negative delta
			{Name: "a", Value: buckets.Float(math.Copysign(0, -1))},
			{Name: "env.hum", Value: buckets.Int(math.MinInt64)},
		}},
		{Device: device, Ticks: base + 1, Values: []buckets.Field{
			{Name: "env.b", Value: buckets.Bool(false)},
			{Name: "env.hum", Value: buckets.Int(math.MaxInt64)},
			{Name: "env.site", Value: buckets.String("")},
			{Name: "z", Value: buckets.Float(-1e300)},
		}},
	}
}

func TestRoundTrip(t *testing.T) {
	want := sampleReadings()
	data := encode(want)
	got, _, err := Decode(device, data)
	require.NoError(t, err)
	require.Equal(t, want, got)
	assert.True(t, math.Signbit(got[1].Values[0].Value.AsFloat()), "-0 keeps its sign")
	assert.Equal(t, 3, Count(data))
}

func TestSizeBoundsThePayload(t *testing.T) {
	var e Encoder
	e.Reset()
	for _, r := range sampleReadings() {
		before := e.Size()
		e.Add(r.Ticks, r.Values)
		assert.LessOrEqual(t, e.Size(), before+AddSize(r.Values))
		assert.LessOrEqual(t, len(e.Append(nil)), e.Size())
	}
}

// rawPayload writes a payload by hand, so tests can break its rules.
type rawPayload struct{ b []byte }

func newRaw(names ...string) *rawPayload {
	p := &rawPayload{b: []byte{version}}
	p.b = binary.AppendUvarint(p.b, uint64(len(names)))
	for _, n := range names {
		p.b = binary.AppendUvarint(p.b, uint64(len(n)))
		p.b = append(p.b, n...)
	}
	return p
}

func (p *rawPayload) uv(v uint64) *rawPayload { p.b = binary.AppendUvarint(p.b, v); return p }
func (p *rawPayload) v(v int64) *rawPayload   { p.b = binary.AppendVarint(p.b, v); return p }
func (p *rawPayload) raw(b ...byte) *rawPayload {
	p.b = append(p.b, b...)
	return p
}

// one is a reading of one int value with name index idx.
func (p *rawPayload) one(delta int64, idx uint64) *rawPayload {
	return p.v(delta).uv(1).uv(idx).raw(byte(buckets.KindInt)).v(7)
}

func TestDecodeRejects(t *testing.T) {
	long := strings.Repeat("s", buckets.MaxStringLen+1)
	for _, tc := range []struct {
		name string
		data []byte
		code buckets.Code
		msg  string
	}{
		{"empty", nil, buckets.CodeInvalidPayload, "not version 1"},
		{"version", []byte{3}, buckets.CodeInvalidPayload, "not version 1 or 2"},
		{"json", []byte(`{"ts":1,"v":1}`), buckets.CodeInvalidPayload, "not version 1"},
		{"no readings", newRaw("v").uv(0).b, buckets.CodeEmptyBatch, ""},
		{"too many readings", newRaw("v").uv(buckets.MaxBatch + 1).b, buckets.CodeBatchTooLarge, "10001 readings is more than 10000"},
		{"count beyond the bytes", newRaw("v").uv(1000).one(int64(base), 0).b, buckets.CodeInvalidPayload, "cannot fit"},
		{"names out of order", newRaw("b", "a").uv(1).one(int64(base), 0).b, buckets.CodeInvalidPayload, `name "a" does not follow "b"`},
		{"name twice", newRaw("a", "a").uv(1).one(int64(base), 0).b, buckets.CodeInvalidPayload, `name "a" does not follow "a"`},
		{"bad name", newRaw("a b").uv(1).one(int64(base), 0).b, buckets.CodeInvalidName, ""},
		{"name too long", newRaw(strings.Repeat("n", buckets.MaxValueNameLen+1)).b, buckets.CodeInvalidPayload, "name length 65 is more than 64"},
		{"index out of range", newRaw("v").uv(1).one(int64(base), 1).b, buckets.CodeInvalidPayload, "name index 1"},
		{"indexes not ascending", newRaw("a", "b").uv(1).v(int64(base)).uv(2).
			uv(1).raw(byte(buckets.KindBool), 1).uv(0).raw(byte(buckets.KindBool), 1).b, buckets.CodeInvalidPayload, "name index 0: want 2 to 1"},
		{"no values", newRaw("v").uv(1).v(int64(base)).uv(0).b, buckets.CodeNoValues, ""},
		{"too many values", newRaw("v").uv(1).v(int64(base)).uv(buckets.MaxValues + 1).b, buckets.CodeTooManyValues, "253 values is more than 252"},
		{"ticks out of range", newRaw("v").uv(1).one(-1, 0).b, buckets.CodeInvalidTime, ""},
		{"unknown kind", newRaw("v").uv(1).v(int64(base)).uv(1).uv(0).raw(9).b, buckets.CodeInvalidPayload, "unknown kind 9"},
		{"bool not 0 or 1", newRaw("v").uv(1).v(int64(base)).uv(1).uv(0).raw(byte(buckets.KindBool), 2).b, buckets.CodeInvalidPayload, "want a byte 0 or 1"},
		{"NaN", newRaw("v").uv(1).v(int64(base)).uv(1).uv(0).raw(byte(buckets.KindFloat)).
			raw(binary.LittleEndian.AppendUint64(nil, math.Float64bits(math.NaN()))...).b, buckets.CodeInvalidValue, ""},
		{"string too long", newRaw("v").uv(1).v(int64(base)).uv(1).uv(0).raw(byte(buckets.KindString)).
			uv(uint64(len(long))).raw([]byte(long)...).b, buckets.CodeStringTooLong, ""},
		{"string beyond the end", newRaw("v").uv(1).v(int64(base)).uv(1).uv(0).raw(byte(buckets.KindString)).uv(5).raw('a').b,
			buckets.CodeInvalidPayload, "payload ends"},
		{"trailing bytes", newRaw("v").uv(1).one(int64(base), 0).raw(0).b, buckets.CodeInvalidPayload, "1 bytes after the last reading"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Decode(device, tc.data)
			var ve *buckets.ValidationError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tc.code, ve.Code, ve.Error())
			assert.Contains(t, ve.Error(), tc.msg)
		})
	}
	_, _, err := Decode("bad.device", encode(sampleReadings()))
	var ve *buckets.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, buckets.CodeInvalidDevice, ve.Code)
}

// Each limit holds at its boundary: the largest payload the limits
// allow decodes.
func TestDecodeLimitsAccepted(t *testing.T) {
	values := make([]buckets.Field, buckets.MaxValues)
	for i := range values {
		values[i] = buckets.Field{Name: fmt.Sprintf("v%03d", i), Value: buckets.Int(int64(i))}
	}
	values[0] = buckets.Field{Name: strings.Repeat("a", buckets.MaxValueNameLen), Value: buckets.String(strings.Repeat("s", buckets.MaxStringLen))}
	rs := make([]buckets.Reading, buckets.MaxBatch)
	for i := range rs {
		rs[i] = buckets.Reading{Device: device, Ticks: base + buckets.Ticks(i), Values: values[:1+i%3]}
	}
	rs[0].Values = values
	got, _, err := Decode(device, encode(rs))
	require.NoError(t, err)
	assert.Equal(t, rs, got)
}

// Every truncation of a valid payload is an error, never a panic.
func TestDecodeTruncated(t *testing.T) {
	data := encode(sampleReadings())
	for n := range len(data) {
		_, _, err := Decode(device, data[:n])
		assert.Error(t, err, "truncated to %d bytes", n)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encode(sampleReadings()))
	f.Add(newRaw("v").uv(1).one(int64(base), 0).b)
	f.Add([]byte{1, 0})
	f.Add(v2().uv(1).v(int64(base)).uv(1).str("fleet").str("East").b)
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, _, err := Decode(device, data)
		if err != nil {
			var ve *buckets.ValidationError
			require.ErrorAs(t, err, &ve)
			return
		}
		for _, r := range rs {
			require.NoError(t, r.Validate())
		}
		again, _, err := Decode(device, encode(rs))
		require.NoError(t, err)
		assert.Equal(t, rs, again, "re-encoding gives the same readings")
		assert.Equal(t, len(rs), Count(data))
	})
}

// TestRoundTripRepeatedNames covers readings that repeat the names of
// the reading before them (the encoder reuses their indexes) and
// readings whose names differ from it with the same count.
func TestRoundTripRepeatedNames(t *testing.T) {
	fields := func(names ...string) []buckets.Field {
		var fs []buckets.Field
		for i, n := range names {
			fs = append(fs, buckets.Field{Name: n, Value: buckets.Int(int64(i + 1))})
		}
		return fs
	}
	var want []buckets.Reading
	for i, names := range [][]string{{"a", "c"}, {"a", "c"}, {"a", "b"}, {"b", "c"}, {"b", "c"}, {"a"}, {"a", "b", "c"}, {"a", "c"}} {
		want = append(want, buckets.Reading{Device: device, Ticks: base + buckets.Ticks(i), Values: fields(names...)})
	}
	got, _, err := Decode(device, encode(want))
	require.NoError(t, err)
	require.Equal(t, want, got)
}
