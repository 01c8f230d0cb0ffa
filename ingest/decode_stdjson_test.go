package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// decodeStdJSON is the payload decoder written on encoding/json, kept
// to measure the hand-written Decode against (BENCHMARKS.md, "Ingest
// payload decoding"). It accepts the same valid payloads and returns
// the same readings; it is not the decoder in use. Unlike Decode it
// does not notice duplicate names (encoding/json keeps the last) and
// words its errors differently.
func decodeStdJSON(device buckets.DeviceID, data []byte, def buckets.Ticks) ([]buckets.Reading, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	if dec.More() {
		return nil, errors.New("payload: more than one JSON value")
	}
	var objs []map[string]any
	switch x := v.(type) {
	case map[string]any:
		objs = []map[string]any{x}
	case []any:
		if len(x) == 0 || len(x) > buckets.MaxBatch {
			return nil, fmt.Errorf("payload: %d readings", len(x))
		}
		for i, e := range x {
			o, ok := e.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("reading %d: not an object", i)
			}
			objs = append(objs, o)
		}
	default:
		return nil, errors.New("payload: not an object or array")
	}
	rs := make([]buckets.Reading, len(objs))
	for i, o := range objs {
		r := buckets.Reading{Device: device, Ticks: def}
		for k, val := range o {
			switch k {
			case "ts":
				k, err := stdTicks(val)
				if err != nil {
					return nil, fmt.Errorf("reading %d: ts: %w", i, err)
				}
				r.Ticks = k
			case "device":
				if s, ok := val.(string); !ok || s != string(device) {
					return nil, fmt.Errorf("reading %d: device mismatch", i)
				}
			case "values":
				m, ok := val.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("reading %d: values is not an object", i)
				}
				for name, x := range m {
					fv, err := stdValue(x)
					if err != nil {
						return nil, fmt.Errorf("reading %d: values.%s: %w", i, name, err)
					}
					r.Values = append(r.Values, buckets.Field{Name: name, Value: fv})
				}
			default:
				fv, err := stdValue(val)
				if err != nil {
					return nil, fmt.Errorf("reading %d: %s: %w", i, k, err)
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

func stdTicks(v any) (buckets.Ticks, error) {
	switch x := v.(type) {
	case string:
		return buckets.ParseTime(x)
	case json.Number:
		ms, err := x.Int64()
		if err != nil {
			return 0, err
		}
		return buckets.TicksFromEpochMillis(ms)
	}
	return 0, errors.New("not a time")
}

func stdValue(v any) (buckets.Value, error) {
	switch x := v.(type) {
	case string:
		return buckets.String(x), nil
	case bool:
		return buckets.Bool(x), nil
	case json.Number:
		if !strings.ContainsAny(string(x), ".eE") {
			if i, err := x.Int64(); err == nil {
				return buckets.Int(i), nil
			}
		}
		f, err := x.Float64()
		if err != nil {
			return buckets.Value{}, err
		}
		return buckets.Float(f), nil
	}
	return buckets.Value{}, errors.New("null, object or array")
}

// benchPayloads are the three payload forms of ingest/README.md.
func benchPayloads() []struct{ name, payload string } {
	var batch strings.Builder
	batch.WriteByte('[')
	for i := range 1000 {
		if i > 0 {
			batch.WriteByte(',')
		}
		fmt.Fprintf(&batch, `{"ts":%d,"temp":%d.25,"humidity":41.5,"ok":true,"rssi":-71}`, exampleMillis+int64(i), 20+i%5)
	}
	batch.WriteByte(']')
	return []struct{ name, payload string }{
		{"flat", `{"ts":1795309323456,"temp":21.5,"humidity":41.5,"ok":true,"rssi":-71}`},
		{"nested", `{"ts":"2026-11-22T01:02:03.456Z","values":{"temp":21.5,"humidity":41.5,"ok":true,"rssi":-71}}`},
		{"batch1000", batch.String()},
	}
}

// The two decoders agree on valid payloads, so the benchmark compares
// the same work.
func TestStdJSONDecoderAgrees(t *testing.T) {
	for _, p := range benchPayloads() {
		want, _, err := Decode("dev-1", []byte(p.payload), defaultTicks)
		require.NoError(t, err)
		got, err := decodeStdJSON("dev-1", []byte(p.payload), defaultTicks)
		require.NoError(t, err)
		require.Equal(t, want, got, p.name)
	}
}

// BenchmarkDecodeStdJSON decodes the payloads of BenchmarkDecode with
// encoding/json.
func BenchmarkDecodeStdJSON(b *testing.B) {
	for _, c := range benchPayloads() {
		data := []byte(c.payload)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := decodeStdJSON("dev-1", data, defaultTicks); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
