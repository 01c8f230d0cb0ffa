//go:build goexperiment.jsonv2

package ingest

import (
	"encoding/json/jsontext"
	jsonv2 "encoding/json/v2"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// decodeJSONv2 is the payload decoder written on encoding/json/v2
// (which, unlike v1, rejects duplicate names by itself), kept only to
// measure Decode against: GOEXPERIMENT=jsonv2 go test ./ingest -bench Decode.
func decodeJSONv2(device buckets.DeviceID, data []byte, def buckets.Ticks) ([]buckets.Reading, error) {
	var objs []map[string]jsontext.Value
	v := jsontext.Value(data)
	switch v.Kind() {
	case '{':
		var o map[string]jsontext.Value
		if err := jsonv2.Unmarshal(data, &o); err != nil {
			return nil, err
		}
		objs = append(objs, o)
	case '[':
		if err := jsonv2.Unmarshal(data, &objs); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("payload: not an object or array")
	}
	rs := make([]buckets.Reading, len(objs))
	for i, o := range objs {
		r := buckets.Reading{Device: device, Ticks: def}
		for k, raw := range o {
			switch k {
			case "ts":
				switch raw.Kind() {
				case '"':
					var s string
					if err := jsonv2.Unmarshal(raw, &s); err != nil {
						return nil, err
					}
					t, err := buckets.ParseTime(s)
					if err != nil {
						return nil, err
					}
					r.Ticks = t
				case '0':
					ms, err := strconv.ParseInt(string(raw), 10, 64)
					if err != nil {
						return nil, err
					}
					t, err := buckets.TicksFromEpochMillis(ms)
					if err != nil {
						return nil, err
					}
					r.Ticks = t
				default:
					return nil, fmt.Errorf("reading %d: ts", i)
				}
			case "device":
				var s string
				if err := jsonv2.Unmarshal(raw, &s); err != nil || s != string(device) {
					return nil, fmt.Errorf("reading %d: device mismatch", i)
				}
			case "values":
				var m map[string]jsontext.Value
				if err := jsonv2.Unmarshal(raw, &m); err != nil {
					return nil, err
				}
				for name, x := range m {
					fv, err := v2Value(x)
					if err != nil {
						return nil, err
					}
					r.Values = append(r.Values, buckets.Field{Name: name, Value: fv})
				}
			default:
				fv, err := v2Value(raw)
				if err != nil {
					return nil, err
				}
				r.Values = append(r.Values, buckets.Field{Name: k, Value: fv})
			}
		}
		buckets.SortValues(r.Values)
		if err := r.Validate(); err != nil {
			return nil, err
		}
		rs[i] = r
	}
	return rs, nil
}

func v2Value(raw jsontext.Value) (buckets.Value, error) {
	switch raw.Kind() {
	case '"':
		var s string
		err := jsonv2.Unmarshal(raw, &s)
		return buckets.String(s), err
	case 't':
		return buckets.Bool(true), nil
	case 'f':
		return buckets.Bool(false), nil
	case '0':
		if i, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
			return buckets.Int(i), nil
		}
		f, err := strconv.ParseFloat(string(raw), 64)
		return buckets.Float(f), err
	}
	return buckets.Value{}, errors.New("null, object or array")
}

func TestJSONv2DecoderAgrees(t *testing.T) {
	for _, p := range benchPayloads() {
		want, _, err := Decode("dev-1", []byte(p.payload), defaultTicks)
		require.NoError(t, err)
		got, err := decodeJSONv2("dev-1", []byte(p.payload), defaultTicks)
		require.NoError(t, err)
		require.Equal(t, want, got, p.name)
	}
}

func BenchmarkDecodeJSONv2(b *testing.B) {
	for _, c := range benchPayloads() {
		data := []byte(c.payload)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := decodeJSONv2("dev-1", data, defaultTicks); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
