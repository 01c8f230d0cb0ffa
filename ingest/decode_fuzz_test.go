package ingest

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// FuzzDecode checks that Decode never panics, accepts only valid JSON,
// returns readings that validate, survive the storage value codec and
// decode to the same readings when re-encoded, and assignments of valid
// sorted attribute sets at the readings' times, and otherwise fails
// with a ValidationError. The seed corpus is in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"ts":"2026-11-22T01:02:03.456Z","values":{"temp":21.5,"ok":true}}`,
		`{"ts":1795309323456,"temp":21.5,"ok":true,"name":"a\u00e9"}`,
		`[{"a":1},{"values":{"b":-0.0}}]`,
		`{"device":"dev-1","i":9223372036854775808,"x":1e-400}`,
		`{"a":null}`,
		`[]`,
		`[{"ts":1795309323456,"v":1,"attributes":{"fleet":"East","model":"F-150"}},{"v":2,"attributes":{"fleet":"W\u00e9st"}}]`,
		`{"v":1,"attributes":{"fleet":7}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, as, err := Decode("dev-1", data, defaultTicks)
		if err != nil {
			var ve *buckets.ValidationError
			require.True(t, errors.As(err, &ve), "error %v is not a ValidationError", err)
			require.NotEmpty(t, ve.Code)
			require.True(t, ve.Index >= -1 && ve.Index < buckets.MaxBatch, "index %d", ve.Index)
			require.Nil(t, rs)
			return
		}
		require.True(t, json.Valid(data), "accepted invalid JSON %q", data)
		require.NotEmpty(t, rs)
		require.LessOrEqual(t, len(rs), buckets.MaxBatch)
		for i := range rs {
			require.NoError(t, rs[i].Validate())
			require.Equal(t, buckets.DeviceID("dev-1"), rs[i].Device)
		}
		names := map[string]bool{}
		for _, a := range as {
			require.Equal(t, buckets.DeviceID("dev-1"), a.Device)
			require.True(t, slices.ContainsFunc(rs, func(r buckets.Reading) bool { return r.Ticks == a.At }), "assignment at a reading's time")
			require.NotEmpty(t, a.Set)
			a2, verr := buckets.NewAttributes(a.Set.Map())
			require.Nil(t, verr)
			require.Equal(t, a2, a.Set, "sorted, unique, valid")
			for _, x := range a.Set {
				names[x.Name] = true
			}
		}
		require.LessOrEqual(t, len(names), buckets.MaxAttributes)
		again, _, err := Decode("dev-1", encodeReadings(rs), defaultTicks)
		require.NoError(t, err)
		require.Equal(t, rs, again)
	})
}

// encodeReadings writes readings back as a JSON batch in the nested
// form, keeping floats recognisable as floats.
func encodeReadings(rs []buckets.Reading) []byte {
	var b strings.Builder
	b.WriteByte('[')
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"ts":"` + r.Ticks.FormatTime() + `","values":{`)
		for j, fl := range r.Values {
			if j > 0 {
				b.WriteByte(',')
			}
			name, _ := json.Marshal(fl.Name)
			b.Write(name)
			b.WriteByte(':')
			b.WriteString(encodeValue(fl.Value))
		}
		b.WriteString(`}}`)
	}
	b.WriteByte(']')
	return []byte(b.String())
}

func encodeValue(v buckets.Value) string {
	switch v.Kind {
	case buckets.KindFloat:
		s := strconv.FormatFloat(v.AsFloat(), 'g', -1, 64)
		if !strings.ContainsAny(s, ".e") {
			s += ".0"
		}
		return s
	case buckets.KindInt:
		return strconv.FormatInt(v.AsInt(), 10)
	case buckets.KindBool:
		return strconv.FormatBool(v.AsBool())
	default:
		s, _ := json.Marshal(v.AsString())
		return string(s)
	}
}
