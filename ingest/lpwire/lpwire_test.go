package lpwire

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/wire"
)

const base = buckets.Ticks(638_000_000_000_000_000)

// payload is device's readings at base+i of values v_i, in the form of
// package wire, with an attribute assignment when fleet is set.
func payload(t testing.TB, n int, fleet string) []byte {
	t.Helper()
	var e wire.Encoder
	for i := range n {
		e.Add(base+buckets.Ticks(i), []buckets.Field{{Name: "v", Value: buckets.Int(int64(i))}})
	}
	if fleet != "" {
		e.Assign(base, buckets.Attributes{{Name: "fleet", Value: fleet}})
	}
	return e.Append(nil)
}

func TestRoundTrip(t *testing.T) {
	entries := []Entry{
		{Device: "truck_1", Payload: payload(t, 3, "")},
		{Device: "truck_2", Payload: payload(t, 1, "East")},
		{Device: "truck_1", Payload: payload(t, 2, "")}, // a device's second payload
	}
	data := Append(nil, entries)
	size := HeadSize
	for _, e := range entries {
		size += EntrySize(string(e.Device), len(e.Payload))
	}
	assert.LessOrEqual(t, len(data), size, "EntrySize and HeadSize bound the message")

	got, err := Entries(data)
	require.NoError(t, err)
	assert.Equal(t, entries, got)
	rs, as, err := Decode(data, nil)
	require.NoError(t, err)
	require.Len(t, rs, 6)
	assert.Equal(t, 6, Count(data))
	for i, want := range []struct {
		dev buckets.DeviceID
		v   int64
	}{{"truck_1", 0}, {"truck_1", 1}, {"truck_1", 2}, {"truck_2", 0}, {"truck_1", 0}, {"truck_1", 1}} {
		assert.Equal(t, want.dev, rs[i].Device, "reading %d", i)
		assert.Equal(t, want.v, rs[i].Values[0].Value.AsInt(), "reading %d", i)
	}
	require.Len(t, as, 1)
	assert.Equal(t, buckets.DeviceID("truck_2"), as[0].Device)

	// accept refuses the message for a device it does not take.
	_, _, err = Decode(data, func(d buckets.DeviceID) error {
		if d == "truck_2" {
			return buckets.Invalid(buckets.CodeInvalidDevice, -1, "device", "%s is not of this partition", d)
		}
		return nil
	})
	var ve *buckets.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Contains(t, ve.Error(), "truck_2 is not of this partition")
}

func TestIDNamesSubjectAndContent(t *testing.T) {
	a := Append(nil, []Entry{{Device: "a", Payload: payload(t, 1, "")}})
	b := Append(nil, []Entry{{Device: "b", Payload: payload(t, 1, "")}})
	assert.Equal(t, ID("telemetry.1._lines", a), ID("telemetry.1._lines", append([]byte(nil), a...)), "the same content, the same ID")
	assert.NotEqual(t, ID("telemetry.1._lines", a), ID("telemetry.1._lines", b), "equal readings of other devices")
	assert.NotEqual(t, ID("telemetry.1._lines", a), ID("telemetry.2._lines", a), "another subject")
}

// raw builds messages byte by byte.
type raw struct{ b []byte }

func newRaw(n uint64) *raw { return &raw{b: binary.AppendUvarint([]byte{version}, n)} }

func (r *raw) str(s string) *raw {
	r.b = binary.AppendUvarint(r.b, uint64(len(s)))
	r.b = append(r.b, s...)
	return r
}

func (r *raw) bytes(p []byte) *raw { return r.str(string(p)) }

func TestDecodeErrors(t *testing.T) {
	good := payload(t, 1, "")
	for name, tc := range map[string]struct {
		data []byte
		code buckets.Code
		want string
	}{
		"empty":             {nil, buckets.CodeInvalidPayload, "empty message"},
		"version":           {[]byte{2, 1}, buckets.CodeInvalidPayload, "version 2, want 1"},
		"no device":         {newRaw(0).b, buckets.CodeInvalidPayload, "no device"},
		"count past data":   {newRaw(1000).str("a").bytes(good).b, buckets.CodeInvalidPayload, "device count 1000 is more than"},
		"huge count":        {newRaw(1 << 40).b, buckets.CodeInvalidPayload, "device count"},
		"truncated count":   {[]byte{version, 0x80}, buckets.CodeInvalidPayload, "truncated or overlong varint"},
		"empty device":      {newRaw(1).str("").bytes(good).b, buckets.CodeInvalidPayload, "device 0: empty device ID"},
		"long device":       {newRaw(1).str(strings.Repeat("a", buckets.MaxDeviceIDLen+1)).bytes(good).b, buckets.CodeInvalidPayload, "device length"},
		"invalid device":    {newRaw(1).str(Token).bytes(good).b, buckets.CodeInvalidDevice, "device 0"},
		"payload past data": {append(newRaw(1).str("a").b, 200, 1, 1), buckets.CodeInvalidPayload, "payload length 200 is more than 1"},
		"empty payload":     {newRaw(1).str("abcd").str("").b, buckets.CodeInvalidPayload, "empty payload of device abcd"},
		"trailing bytes":    {append(newRaw(1).str("a").bytes(good).b, 0), buckets.CodeInvalidPayload, "1 bytes after the last device's payload"},
		"bad payload":       {newRaw(1).str("dev-9").bytes([]byte{1, 0}).b, buckets.CodeInvalidPayload, "device 0 (dev-9)"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := Decode(tc.data, nil)
			var ve *buckets.ValidationError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tc.code, ve.Code)
			assert.Contains(t, ve.Error(), tc.want)
			if tc.want != "device 0 (dev-9)" {
				assert.Zero(t, Count(tc.data), "a message that cannot be framed counts no reading")
			}
		})
	}
}

// FuzzDecode: no input makes the decoder panic or return anything but
// valid readings or a *buckets.ValidationError; the entries it reads
// encode again to the same entries.
func FuzzDecode(f *testing.F) {
	f.Add(Append(nil, []Entry{{Device: "truck_1", Payload: payload(f, 3, "")}, {Device: "b", Payload: payload(f, 1, "East")}}))
	f.Add(newRaw(1).str("a").bytes([]byte{1, 0}).b)
	f.Add([]byte{version, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := Entries(data)
		if err != nil {
			var ve *buckets.ValidationError
			require.ErrorAs(t, err, &ve)
			return
		}
		again, err := Entries(Append(nil, entries))
		require.NoError(t, err)
		assert.Equal(t, entries, again, "the entries encode again to the same entries")
		rs, _, err := Decode(data, nil)
		if err != nil {
			var ve *buckets.ValidationError
			require.ErrorAs(t, err, &ve)
			return
		}
		for _, r := range rs {
			require.NoError(t, r.Validate())
		}
		assert.Equal(t, len(rs), Count(data))
	})
}
