package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// decodedReading is a reading parsed back the way ingest/README.md reads a
// payload: ts plus named values, nested under "values" or flat.
type decodedReading struct {
	ticks  buckets.Ticks
	values map[string]any
}

// decodePayload parses data as one of the payload shapes ingest/README.md
// accepts and fails the test on anything else: an object or an array
// of 1..MaxBatch objects; ts an RFC 3339 string or epoch milliseconds;
// values finite numbers with valid names, and no other keys.
func decodePayload(t *testing.T, data []byte, nested bool) []decodedReading {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw any
	require.NoError(t, dec.Decode(&raw), "payload is not JSON: %s", data)
	require.False(t, dec.More(), "trailing data after the payload")
	var objs []any
	switch v := raw.(type) {
	case []any:
		require.NotEmpty(t, v, "empty batch")
		require.LessOrEqual(t, len(v), buckets.MaxBatch)
		objs = v
	case map[string]any:
		objs = []any{v}
	default:
		t.Fatalf("payload is %T, want an object or an array", raw)
	}
	out := make([]decodedReading, len(objs))
	for i, o := range objs {
		obj, ok := o.(map[string]any)
		require.True(t, ok, "reading %d is %T, want an object", i, o)
		out[i] = decodeReading(t, obj, nested)
	}
	return out
}

func decodeReading(t *testing.T, obj map[string]any, nested bool) decodedReading {
	t.Helper()
	var r decodedReading
	switch ts := obj["ts"].(type) {
	case string:
		k, err := buckets.ParseTime(ts)
		require.NoError(t, err)
		r.ticks = k
	case json.Number:
		ms, err := ts.Int64()
		require.NoError(t, err, "ts %s is not integer epoch ms", ts)
		k, err := buckets.TicksFromEpochMillis(ms)
		require.NoError(t, err)
		r.ticks = k
	default:
		t.Fatalf("ts is %T (%v), want a string or a number", obj["ts"], obj["ts"])
	}
	values := obj
	if nested {
		require.Len(t, obj, 2, "nested reading has keys other than ts and values: %v", obj)
		v, ok := obj["values"].(map[string]any)
		require.True(t, ok, "values is %T, want an object", obj["values"])
		values = v
	} else {
		values = make(map[string]any, len(obj))
		for k, v := range obj {
			if k != "ts" {
				values[k] = v
			}
		}
	}
	require.NotEmpty(t, values)
	require.LessOrEqual(t, len(values), buckets.MaxValues)
	r.values = make(map[string]any, len(values))
	for name, v := range values {
		require.NoError(t, buckets.ValidateValueName(name))
		num, ok := v.(json.Number)
		require.True(t, ok, "value %s is %T, want a number", name, v)
		f, err := num.Float64()
		require.NoError(t, err)
		r.values[name] = f
	}
	return r
}

func TestAppendPayloadShapes(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 1, 2, 3, 456_000_000, time.UTC)
	names := []string{"temp", "humidity", "battery"}
	one := reading{us: t0.UnixMicro(), vals: []float64{21.5, 40.25, 99}}
	two := reading{us: t0.UnixMicro() + 1000, vals: []float64{-3.75, 0, 100}}
	tests := []struct {
		name     string
		pf       payloadFormat
		readings []reading
		want     string
	}{
		{"nested rfc3339 single", payloadFormat{shapeNested, tsRFC3339}, []reading{one},
			`{"ts":"2026-11-22T01:02:03.456Z","values":{"temp":21.5,"humidity":40.25,"battery":99}}`},
		{"flat rfc3339 single", payloadFormat{shapeFlat, tsRFC3339}, []reading{one},
			`{"ts":"2026-11-22T01:02:03.456Z","temp":21.5,"humidity":40.25,"battery":99}`},
		{"nested epoch-ms single", payloadFormat{shapeNested, tsEpochMillis}, []reading{one},
			`{"ts":1795309323456,"values":{"temp":21.5,"humidity":40.25,"battery":99}}`},
		{"flat epoch-ms batch", payloadFormat{shapeFlat, tsEpochMillis}, []reading{one, two},
			`[{"ts":1795309323456,"temp":21.5,"humidity":40.25,"battery":99},{"ts":1795309323457,"temp":-3.75,"humidity":0,"battery":100}]`},
		{"nested rfc3339 batch", payloadFormat{shapeNested, tsRFC3339}, []reading{one, two},
			`[{"ts":"2026-11-22T01:02:03.456Z","values":{"temp":21.5,"humidity":40.25,"battery":99}},{"ts":"2026-11-22T01:02:03.457Z","values":{"temp":-3.75,"humidity":0,"battery":100}}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := appendPayload(nil, tt.pf, names, tt.readings)
			assert.Equal(t, tt.want, string(got))

			decoded := decodePayload(t, got, tt.pf.shape == shapeNested)
			require.Len(t, decoded, len(tt.readings))
			for i, r := range tt.readings {
				assert.Equal(t, buckets.MustTicks(time.UnixMicro(r.us)), decoded[i].ticks, "reading %d ts", i)
				want := map[string]any{}
				for j, n := range names {
					want[n] = r.vals[j]
				}
				assert.Equal(t, want, decoded[i].values, "reading %d values", i)
			}
		})
	}
}

func TestAppendTS(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 1, 2, 3, 456_000_000, time.UTC).UnixMicro()
	tests := []struct {
		form tsForm
		us   int64
		want string
	}{
		{tsRFC3339, t0, `"2026-11-22T01:02:03.456Z"`},
		{tsRFC3339, t0 + 1, `"2026-11-22T01:02:03.456001Z"`},
		{tsRFC3339, t0 + 999, `"2026-11-22T01:02:03.456999Z"`},
		{tsRFC3339, 0, `"1970-01-01T00:00:00.000Z"`},
		{tsEpochMillis, t0, `1795309323456`},
		{tsEpochMillis, t0 + 999, `1795309323456`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			got := string(appendTS(nil, tt.form, tt.us))
			assert.Equal(t, tt.want, got)
			k, err := buckets.ParseTime(strings.Trim(got, `"`))
			require.NoError(t, err)
			wantUS := tt.us
			if tt.form == tsEpochMillis {
				wantUS -= wantUS % 1000
			}
			assert.Equal(t, buckets.MustTicks(time.UnixMicro(wantUS)), k)
		})
	}
}

func TestAppendPayloadAppendsToDst(t *testing.T) {
	r := reading{us: 0, vals: []float64{1}}
	got := appendPayload([]byte("prefix:"), payloadFormat{shapeFlat, tsEpochMillis}, []string{"temp"}, []reading{r})
	assert.Equal(t, `prefix:{"ts":0,"temp":1}`, string(got))
}

func TestAppendPayloadAtLimits(t *testing.T) {
	t.Run("batch of MaxBatch readings", func(t *testing.T) {
		names := valueNames(3)
		rs := make([]reading, buckets.MaxBatch)
		for i := range rs {
			rs[i] = reading{us: int64(1_700_000_000_000_000 + 1000*i), vals: []float64{float64(i), 50, 99.5}}
		}
		decoded := decodePayload(t, appendPayload(nil, payloadFormat{shapeFlat, tsRFC3339}, names, rs), false)
		require.Len(t, decoded, buckets.MaxBatch)
		assert.Equal(t, float64(buckets.MaxBatch-1), decoded[buckets.MaxBatch-1].values["temp"])
	})
	t.Run("reading of MaxValues values", func(t *testing.T) {
		names := valueNames(buckets.MaxValues)
		vals := make([]float64, len(names))
		for i := range vals {
			vals[i] = float64(i) + 0.25
		}
		r := reading{us: 1_700_000_000_000_000, vals: vals}
		decoded := decodePayload(t, appendPayload(nil, payloadFormat{shapeNested, tsEpochMillis}, names, []reading{r}), true)
		require.Len(t, decoded, 1)
		assert.Len(t, decoded[0].values, buckets.MaxValues)
		assert.Equal(t, 251.25, decoded[0].values["sensor_252"])
	})
}

func TestAppendNumber(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{21.5, "21.5"}, {0, "0"}, {-0.01, "-0.01"}, {100, "100"}, {1e21, "1000000000000000000000"},
		{round2(21.456), "21.46"}, {round2(0.1 + 0.2), "0.3"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.in), func(t *testing.T) {
			got := string(appendNumber(nil, tt.in))
			assert.Equal(t, tt.want, got)
			var back float64
			require.NoError(t, json.Unmarshal([]byte(got), &back))
			assert.Equal(t, tt.in, back)
		})
	}
}

func TestValueNames(t *testing.T) {
	assert.Equal(t, []string{"temp"}, valueNames(1))
	assert.Equal(t, []string{"temp", "humidity", "battery"}, valueNames(3))
	assert.Equal(t, []string{"temp", "humidity", "battery", "sensor_4", "sensor_5"}, valueNames(5))
	for _, n := range valueNames(buckets.MaxValues) {
		assert.NoError(t, buckets.ValidateValueName(n))
		assert.False(t, strings.ContainsAny(n, `"\`), "name %q would need escaping", n)
	}
}

func BenchmarkAppendPayload(b *testing.B) {
	names := valueNames(3)
	rs := make([]reading, 100)
	for i := range rs {
		rs[i] = reading{us: int64(1_700_000_000_000_000 + 1000*i), vals: []float64{21.53, 45.12, 87.4}}
	}
	buf := make([]byte, 0, 16<<10)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendPayload(buf[:0], payloadFormat{shapeNested, tsRFC3339}, names, rs)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rs)), "ns/reading")
}
