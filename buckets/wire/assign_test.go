package wire

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func attrs(kv ...string) buckets.Attributes {
	var a buckets.Attributes
	for i := 0; i < len(kv); i += 2 {
		a = append(a, buckets.Attribute{Name: kv[i], Value: kv[i+1]})
	}
	return a
}

// A payload with assignments is version 2 and gives them back; one
// without stays version 1, byte for byte what the encoder wrote before
// assignments existed.
func TestRoundTripAssignments(t *testing.T) {
	rs := sampleReadings()
	v1 := encode(rs)
	assert.Equal(t, byte(1), v1[0])
	got, as, err := Decode(device, v1)
	require.NoError(t, err)
	assert.Equal(t, rs, got)
	assert.Nil(t, as)

	var e Encoder
	e.Reset()
	for _, r := range rs {
		e.Add(r.Ticks, r.Values)
	}
	want := []buckets.Assignment{
		{Device: device, At: base + 10, Set: attrs("fleet", "East", "model", "F-150 \"x\"")},
		{Device: device, At: base, Set: attrs("site", strings.Repeat("é", 128))},
	}
	sizeBefore := e.Size()
	for _, a := range want {
		e.Assign(a.At, a.Set)
	}
	assert.LessOrEqual(t, e.Size(), sizeBefore+binaryMaxVarint+AssignSize(want[0].Set)+AssignSize(want[1].Set))
	data := e.Append(nil)
	assert.LessOrEqual(t, len(data), e.Size())
	assert.Equal(t, byte(2), data[0])
	got, as, err = Decode(device, data)
	require.NoError(t, err)
	assert.Equal(t, rs, got)
	assert.Equal(t, want, as)
	assert.Equal(t, len(rs), Count(data))

	for n := range len(data) {
		_, _, err := Decode(device, data[:n])
		assert.Error(t, err, "truncated to %d bytes", n)
	}

	e.Reset()
	e.Add(base, rs[0].Values)
	assert.Equal(t, byte(1), e.Append(nil)[0], "Reset forgets the assignments")
}

const binaryMaxVarint = 10

// v2 is a version 2 payload of one reading, then the assignments the
// test writes.
func v2() *rawPayload {
	p := newRaw("v").uv(1).one(int64(base), 0)
	p.b[0] = versionAssigns
	return p
}

func (p *rawPayload) str(s string) *rawPayload { return p.uv(uint64(len(s))).raw([]byte(s)...) }

func TestDecodeRejectsAssignments(t *testing.T) {
	many := v2().uv(2).v(int64(base)).uv(40)
	for i := range 40 {
		many.str(fmt.Sprintf("a%02d", i)).str("x")
	}
	many.v(int64(base)).uv(40)
	for i := 30; i < 70; i++ {
		many.str(fmt.Sprintf("a%02d", i)).str("x")
	}
	for _, tc := range []struct {
		name string
		data []byte
		code buckets.Code
		msg  string
	}{
		{"empty set", v2().uv(1).v(int64(base)).uv(0).b, buckets.CodeInvalidPayload, "at least one attribute"},
		{"too many in a set", v2().uv(1).v(int64(base)).uv(buckets.MaxAttributes + 1).b, buckets.CodeInvalidPayload, "attribute count 65 is more than 64"},
		{"too many together", many.b, buckets.CodeTooManyAttributes, "name 70 attributes"},
		{"names out of order", v2().uv(1).v(int64(base)).uv(2).str("b").str("x").str("a").str("y").b,
			buckets.CodeInvalidPayload, `attribute "a" does not follow "b"`},
		{"name twice", v2().uv(1).v(int64(base)).uv(2).str("a").str("x").str("a").str("y").b,
			buckets.CodeInvalidPayload, `attribute "a" does not follow "a"`},
		{"bad name", v2().uv(1).v(int64(base)).uv(1).str("a.b").str("x").b, buckets.CodeInvalidAttributeName, "attributes.a.b"},
		{"name device", v2().uv(1).v(int64(base)).uv(1).str("device").str("x").b, buckets.CodeInvalidAttributeName, "names the device"},
		{"empty value", v2().uv(1).v(int64(base)).uv(1).str("a").str("").b, buckets.CodeInvalidAttributeValue, "attributes.a"},
		{"value not UTF-8", v2().uv(1).v(int64(base)).uv(1).str("a").str("\xff").b, buckets.CodeInvalidAttributeValue, "UTF-8"},
		{"value too long", v2().uv(1).v(int64(base)).uv(1).str("a").str(strings.Repeat("v", 257)).b,
			buckets.CodeInvalidPayload, "attribute value length 257 is more than 256"},
		{"time out of range", v2().uv(1).v(-1).b, buckets.CodeInvalidTime, "outside 0001..9999"},
		{"count beyond the bytes", v2().uv(100).v(int64(base)).b, buckets.CodeInvalidPayload, "cannot fit"},
		{"trailing bytes", v2().uv(1).v(int64(base)).uv(1).str("a").str("x").raw(0).b, buckets.CodeInvalidPayload, "1 bytes after the last assignment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, as, err := Decode(device, tc.data)
			var ve *buckets.ValidationError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tc.code, ve.Code, ve.Error())
			assert.Contains(t, ve.Error(), tc.msg)
			assert.Nil(t, as)
		})
	}
	// At the limits: 64 attributes of the longest name and value.
	p := v2().uv(1).v(int64(base)).uv(buckets.MaxAttributes)
	for i := range buckets.MaxAttributes {
		p.str(fmt.Sprintf("%s%02d", strings.Repeat("n", buckets.MaxAttributeNameBytes-2), i)).str(strings.Repeat("v", buckets.MaxAttributeValueBytes))
	}
	_, as, err := Decode(device, p.b)
	require.NoError(t, err)
	assert.Len(t, as[0].Set, buckets.MaxAttributes)
}
