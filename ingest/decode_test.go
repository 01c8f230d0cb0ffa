package ingest

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// 2026-11-22T01:02:03.456Z, as api/README.md spells it out.
const (
	exampleMillis = 1795309323456
	exampleTicks  = buckets.Ticks(639309061234560000)
	defaultTicks  = buckets.Ticks(639309061000000000)
)

func fields(kv ...any) []buckets.Field {
	var fs []buckets.Field
	for i := 0; i < len(kv); i += 2 {
		var v buckets.Value
		switch x := kv[i+1].(type) {
		case float64:
			v = buckets.Float(x)
		case int:
			v = buckets.Int(int64(x))
		case int64:
			v = buckets.Int(x)
		case bool:
			v = buckets.Bool(x)
		case string:
			v = buckets.String(x)
		default:
			panic(fmt.Sprintf("unsupported %T", x))
		}
		fs = append(fs, buckets.Field{Name: kv[i].(string), Value: v})
	}
	return fs
}

func reading(k buckets.Ticks, kv ...any) buckets.Reading {
	return buckets.Reading{Device: "dev-1", Ticks: k, Values: fields(kv...)}
}

func TestDecodeAccepts(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		want    []buckets.Reading
	}{
		{"nested form", `{"ts":"2026-11-22T01:02:03.456Z","values":{"temp":21.5,"ok":true,"n":3,"s":"x"}}`,
			[]buckets.Reading{reading(exampleTicks, "n", 3, "ok", true, "s", "x", "temp", 21.5)}},
		{"flat form with epoch millis", `{"ts":1795309323456,"temp":21.5,"ok":false}`,
			[]buckets.Reading{reading(exampleTicks, "ok", false, "temp", 21.5)}},
		{"offset and nanoseconds", `{"ts":"2026-11-22T02:02:03.4560001+01:00","v":1}`,
			[]buckets.Reading{reading(exampleTicks+1, "v", 1)}},
		{"ts as a digit string", `{"ts":"1795309323456","v":1}`,
			[]buckets.Reading{reading(exampleTicks, "v", 1)}},
		{"missing ts uses the default", `{"temp":1.5}`,
			[]buckets.Reading{reading(defaultTicks, "temp", 1.5)}},
		{"matching device", `{"device":"dev-1","values":{"a":1}}`,
			[]buckets.Reading{reading(defaultTicks, "a", 1)}},
		{"batch of both forms", ` [ {"ts":1795309323456,"a":1} , {"values":{"b":"x"}} ] `,
			[]buckets.Reading{reading(exampleTicks, "a", 1), reading(defaultTicks, "b", "x")}},
		{"integers and floats", `{"i":-0,"max":9223372036854775807,"min":-9223372036854775808,"big":9223372036854775808,"f":1.0,"e":1e2,"neg":-2.5E-1}`,
			[]buckets.Reading{reading(defaultTicks, "big", 9223372036854775808.0, "e", 100.0, "f", 1.0,
				"i", 0, "max", int64(math.MaxInt64), "min", int64(math.MinInt64), "neg", -0.25)}},
		{"tiny float underflows to zero", `{"x":1e-400}`,
			[]buckets.Reading{reading(defaultTicks, "x", 0.0)}},
		{"escapes", `{"t\u0065mp":"a\"b\\\/\b\f\n\r\t\u00e9\ud83d\ude00\ud800"}`,
			[]buckets.Reading{reading(defaultTicks, "temp", "a\"b\\/\b\f\n\r\té😀\uFFFD")}},
		{"value names: 64 characters, dots and dashes", `{"` + strings.Repeat("n", 64) + `":1,"_a.b-c":2}`,
			[]buckets.Reading{reading(defaultTicks, "_a.b-c", 2, strings.Repeat("n", 64), 1)}},
		{"a value named ts inside values", `{"ts":1795309323456,"values":{"ts":5}}`,
			[]buckets.Reading{reading(exampleTicks, "ts", 5)}},
		{"string of 4096 bytes", `{"s":"` + strings.Repeat("é", 2048) + `"}`,
			[]buckets.Reading{reading(defaultTicks, "s", strings.Repeat("é", 2048))}},
		{"last representable millisecond", `{"ts":253402300799999,"v":1}`,
			[]buckets.Reading{reading(buckets.MaxTicks-9999, "v", 1)}},
		{"first representable millisecond", `{"ts":-62135596800000,"v":1}`,
			[]buckets.Reading{reading(0, "v", 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := Decode("dev-1", []byte(tt.payload), defaultTicks)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	name65 := strings.Repeat("n", 65)
	tests := []struct {
		name    string
		payload string
		code    buckets.Code
		index   int
		field   string
	}{
		{"not JSON", `hello`, buckets.CodeInvalidPayload, -1, ""},
		{"empty payload", ``, buckets.CodeInvalidPayload, -1, ""},
		{"whitespace only", " \n", buckets.CodeInvalidPayload, -1, ""},
		{"a string", `"x"`, buckets.CodeInvalidPayload, -1, ""},
		{"truncated object", `{"a":1`, buckets.CodeInvalidPayload, 0, ""},
		{"trailing data", `{"a":1}x`, buckets.CodeInvalidPayload, -1, ""},
		{"two objects", `{"a":1}{"a":1}`, buckets.CodeInvalidPayload, -1, ""},
		{"trailing comma", `{"a":1,}`, buckets.CodeInvalidPayload, 0, ""},
		{"leading zero", `{"a":01}`, buckets.CodeInvalidPayload, 0, ""},
		{"bare minus", `{"a":-}`, buckets.CodeInvalidPayload, 0, ""},
		{"unquoted key", `{a:1}`, buckets.CodeInvalidPayload, 0, ""},
		{"bad escape", `{"a":"\x"}`, buckets.CodeInvalidPayload, 0, ""},
		{"raw control character", "{\"a\":\"x\ny\"}", buckets.CodeInvalidPayload, 0, ""},
		{"batch element not an object", `[{"a":1},2]`, buckets.CodeInvalidPayload, 1, ""},
		{"empty batch", `[]`, buckets.CodeEmptyBatch, -1, ""},
		{"values not an object", `{"values":3}`, buckets.CodeInvalidPayload, 0, "values"},
		{"values then flat", `{"values":{"a":1},"b":2}`, buckets.CodeInvalidPayload, 0, "values.b"},
		{"flat then values", `{"b":2,"values":{"a":1}}`, buckets.CodeInvalidPayload, 0, "values"},
		{"ts twice", `{"ts":1,"ts":2,"a":1}`, buckets.CodeInvalidPayload, 0, "ts"},
		{"device mismatch", `{"device":"dev-2","a":1}`, buckets.CodeDeviceMismatch, 0, "device"},
		{"device not a string", `{"device":7,"a":1}`, buckets.CodeDeviceMismatch, 0, "device"},
		{"no values", `{"ts":1795309323456}`, buckets.CodeNoValues, 0, "values"},
		{"empty values object", `{"values":{}}`, buckets.CodeNoValues, 0, "values"},
		{"null value", `{"a":null}`, buckets.CodeInvalidValue, 0, "values.a"},
		{"nested object value", `{"a":{"b":1}}`, buckets.CodeInvalidValue, 0, "values.a"},
		{"array value", `{"values":{"a":[1]}}`, buckets.CodeInvalidValue, 0, "values.a"},
		{"huge number", `{"a":1e999}`, buckets.CodeInvalidValue, 0, "values.a"},
		{"huge negative number", `{"a":-1e999}`, buckets.CodeInvalidValue, 0, "values.a"},
		{"invalid UTF-8 string", "{\"a\":\"\xff\"}", buckets.CodeInvalidValue, 0, "values.a"},
		{"string of 4097 bytes", `{"s":"` + strings.Repeat("é", 2048) + `x"}`, buckets.CodeStringTooLong, 0, "values.s"},
		{"value name of 65 characters", `{"` + name65 + `":1}`, buckets.CodeInvalidName, 0, "values." + name65[:16] + "..."},
		{"value name with a space", `{"te mp":1}`, buckets.CodeInvalidName, 0, "values.te mp"},
		{"value name starting with a digit", `{"1a":1}`, buckets.CodeInvalidName, 0, "values.1a"},
		{"empty value name", `{"":1}`, buckets.CodeInvalidName, 0, "values"},
		{"duplicate value name", `{"a":1,"b":2,"a":3}`, buckets.CodeDuplicateValue, 0, "values.a"},
		{"duplicate nested name", `{"values":{"a":1,"a":1}}`, buckets.CodeDuplicateValue, 0, "values.a"},
		{"second reading of a batch", `[{"a":1},{"b":null}]`, buckets.CodeInvalidValue, 1, "values.b"},
		{"ts fraction", `{"ts":1795309323456.5,"a":1}`, buckets.CodeInvalidTime, 0, "ts"},
		{"ts exponent", `{"ts":1e12,"a":1}`, buckets.CodeInvalidTime, 0, "ts"},
		{"ts past year 9999 in millis", `{"ts":99999999999999999,"a":1}`, buckets.CodeInvalidTime, 0, "ts"},
		{"ts one millisecond past 9999", `{"ts":253402300800000,"a":1}`, buckets.CodeInvalidTime, 0, "ts"},
		{"ts one millisecond before 0001", `{"ts":-62135596800001,"a":1}`, buckets.CodeInvalidTime, 0, "ts"},
		{"ts beyond int64", `{"ts":99999999999999999999,"a":1}`, buckets.CodeInvalidTime, 0, "ts"},
		{"ts year 10000", `{"ts":"10000-01-01T00:00:00Z","a":1}`, buckets.CodeInvalidTime, 0, "ts"},
		{"ts garbage", `{"ts":"yesterday","a":1}`, buckets.CodeInvalidTime, 0, "ts"},
		{"ts bool", `{"ts":true,"a":1}`, buckets.CodeInvalidTime, 0, "ts"},
		{"ts object", `{"ts":{},"a":1}`, buckets.CodeInvalidTime, 0, "ts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, _, err := Decode("dev-1", []byte(tt.payload), defaultTicks)
			requireInvalid(t, err, tt.code, tt.index, tt.field)
			assert.Nil(t, rs)
		})
	}
}

func requireInvalid(t *testing.T, err error, code buckets.Code, index int, field string) {
	t.Helper()
	require.Error(t, err)
	assert.ErrorIs(t, err, buckets.ErrInvalidReading)
	var ve *buckets.ValidationError
	require.True(t, errors.As(err, &ve), "error %v is not a ValidationError", err)
	assert.Equal(t, code, ve.Code, "code of %q", err)
	assert.Equal(t, index, ve.Index, "index of %q", err)
	assert.Equal(t, field, ve.Field, "field of %q", err)
	if index >= 0 {
		assert.Contains(t, err.Error(), fmt.Sprintf("reading %d: ", index))
	}
}

func TestDecodeDeviceLength(t *testing.T) {
	ok := buckets.DeviceID(strings.Repeat("d", 64))
	rs, _, err := Decode(ok, []byte(`{"a":1}`), defaultTicks)
	require.NoError(t, err)
	assert.Equal(t, ok, rs[0].Device)

	_, _, err = Decode(ok+"d", []byte(`{"a":1}`), defaultTicks)
	requireInvalid(t, err, buckets.CodeInvalidDevice, -1, "device")
	_, _, err = Decode("dev.1", []byte(`{"a":1}`), defaultTicks)
	requireInvalid(t, err, buckets.CodeInvalidDevice, -1, "device")
}

func TestDecodeValueCount(t *testing.T) {
	payload := func(n int) []byte {
		var b strings.Builder
		b.WriteString(`{"values":{`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"v%03d":%d`, i, i)
		}
		b.WriteString(`}}`)
		return []byte(b.String())
	}
	rs, _, err := Decode("dev-1", payload(buckets.MaxValues), defaultTicks)
	require.NoError(t, err)
	require.Len(t, rs, 1)
	assert.Len(t, rs[0].Values, buckets.MaxValues)

	_, _, err = Decode("dev-1", payload(buckets.MaxValues+1), defaultTicks)
	requireInvalid(t, err, buckets.CodeTooManyValues, 0, "values")
}

func TestDecodeBatchSize(t *testing.T) {
	payload := func(n int) []byte {
		var b strings.Builder
		b.WriteByte('[')
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"ts":%d,"v":%d}`, exampleMillis+int64(i), i)
		}
		b.WriteByte(']')
		return []byte(b.String())
	}
	rs, _, err := Decode("dev-1", payload(buckets.MaxBatch), defaultTicks)
	require.NoError(t, err)
	require.Len(t, rs, buckets.MaxBatch)
	last := rs[buckets.MaxBatch-1]
	assert.Equal(t, exampleTicks+buckets.Ticks(buckets.MaxBatch-1)*10_000, last.Ticks)
	assert.Equal(t, fields("v", buckets.MaxBatch-1), last.Values)

	_, _, err = Decode("dev-1", payload(buckets.MaxBatch+1), defaultTicks)
	requireInvalid(t, err, buckets.CodeBatchTooLarge, -1, "")
}

// The values of one reading must not share capacity with the next, so
// a caller appending to one cannot overwrite another.
func TestDecodeReadingsDoNotAlias(t *testing.T) {
	rs, _, err := Decode("dev-1", []byte(`[{"a":1},{"b":2}]`), defaultTicks)
	require.NoError(t, err)
	_ = append(rs[0].Values, buckets.Field{Name: "z", Value: buckets.Int(9)})
	assert.Equal(t, fields("b", 2), rs[1].Values)
}

func TestCheckWindow(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	w := buckets.Window{Retention: 720 * time.Hour, MaxFutureSkew: 5 * time.Minute}
	oldest := buckets.MustTicks(now.Add(-w.Retention))
	newest := buckets.MustTicks(now.Add(w.MaxFutureSkew))
	tests := []struct {
		name  string
		ticks []buckets.Ticks
		code  buckets.Code
		index int
	}{
		{"oldest accepted", []buckets.Ticks{oldest}, "", 0},
		{"one tick too old", []buckets.Ticks{oldest - 1}, buckets.CodeTooOld, 0},
		{"newest accepted", []buckets.Ticks{newest}, "", 0},
		{"one tick too far in the future", []buckets.Ticks{newest + 1}, buckets.CodeTooFarInFuture, 0},
		{"second reading of a batch", []buckets.Ticks{oldest, newest + 1}, buckets.CodeTooFarInFuture, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rs []buckets.Reading
			for _, k := range tt.ticks {
				rs = append(rs, reading(k, "v", 1))
			}
			err := checkWindow(rs, w, now)
			if tt.code == "" {
				assert.NoError(t, err)
				return
			}
			requireInvalid(t, err, tt.code, tt.index, "ts")
		})
	}
}
