package buckets_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// floatFields returns n float fields named v000, v001, ... (sorted).
func floatFields(n int) []buckets.Field {
	out := make([]buckets.Field, n)
	for i := range out {
		out[i] = buckets.Field{Name: fmt.Sprintf("v%03d", i), Value: buckets.Float(float64(i))}
	}
	return out
}

func reading(fields ...buckets.Field) buckets.Reading {
	return buckets.Reading{Device: "dev-1", Ticks: exampleTicks, Values: fields}
}

func field(name string, v buckets.Value) buckets.Field { return buckets.Field{Name: name, Value: v} }

func TestReadingValidateAccepts(t *testing.T) {
	tests := map[string]buckets.Reading{
		"one value":            reading(field("temp", buckets.Float(21.5))),
		"252 values":           reading(floatFields(buckets.MaxValues)...),
		"string of 4096 bytes": reading(field("s", buckets.String(strings.Repeat("x", 4096)))),
		"empty string":         reading(field("s", buckets.String(""))),
		"every kind": reading(field("b", buckets.Bool(false)), field("f", buckets.Float(math.Copysign(0, -1))),
			field("i", buckets.Int(math.MinInt64)), field("s", buckets.String("\x00"))),
		"largest finite floats": reading(field("max", buckets.Float(math.MaxFloat64)), field("min", buckets.Float(-math.MaxFloat64))),
		"first tick":            {Device: "d", Ticks: 0, Values: floatFields(1)},
		"last tick":             {Device: "d", Ticks: buckets.MaxTicks, Values: floatFields(1)},
	}
	for name, r := range tests {
		t.Run(name, func(t *testing.T) {
			assert.NoError(t, r.Validate())
		})
	}
}

func TestReadingValidateRejects(t *testing.T) {
	tests := []struct {
		name  string
		r     buckets.Reading
		code  buckets.Code
		field string
		msg   string
	}{
		{"no values", reading(), buckets.CodeNoValues, "values", "at least one value"},
		{"253 values", reading(floatFields(buckets.MaxValues + 1)...), buckets.CodeTooManyValues, "values", "253 values is more than 252"},
		{"string of 4097 bytes", reading(field("s", buckets.String(strings.Repeat("x", 4097)))), buckets.CodeStringTooLong, "values.s", "string of 4097 bytes is longer than 4096"},
		{"NaN", reading(field("temp", buckets.Float(math.NaN()))), buckets.CodeInvalidValue, "values.temp", "NaN is not a finite number"},
		{"+Inf", reading(field("temp", buckets.Float(math.Inf(1)))), buckets.CodeInvalidValue, "values.temp", "+Inf is not a finite number"},
		{"-Inf", reading(field("temp", buckets.Float(math.Inf(-1)))), buckets.CodeInvalidValue, "values.temp", "-Inf is not a finite number"},
		{"zero value", reading(field("z", buckets.Value{})), buckets.CodeInvalidValue, "values.z", "unknown value kind 0"},
		{"unsorted names", reading(field("b", buckets.Int(1)), field("a", buckets.Int(2))), buckets.CodeDuplicateValue, "values.a", "unique"},
		{"duplicate names", reading(field("a", buckets.Int(1)), field("a", buckets.Int(2))), buckets.CodeDuplicateValue, "values.a", "unique"},
		{"bad value name", reading(field("1a", buckets.Int(1))), buckets.CodeInvalidName, "values.1a", "must start with a letter or _"},
		{"empty value name", reading(field("", buckets.Int(1))), buckets.CodeInvalidName, "values", "must not be empty"},
		{"bad device", buckets.Reading{Device: "a.b", Ticks: exampleTicks, Values: floatFields(1)}, buckets.CodeInvalidDevice, "device", "has '.'"},
		{"empty device", buckets.Reading{Ticks: exampleTicks, Values: floatFields(1)}, buckets.CodeInvalidDevice, "device", "must not be empty"},
		{"ticks before 0001", buckets.Reading{Device: "d", Ticks: -1, Values: floatFields(1)}, buckets.CodeInvalidTime, "ts", "outside 0001..9999"},
		{"ticks past 9999", buckets.Reading{Device: "d", Ticks: buckets.MaxTicks + 1, Values: floatFields(1)}, buckets.CodeInvalidTime, "ts", "outside 0001..9999"},
	}
	// After a valid reading of another device and other names,
	// ValidateAfter finds the same faults as Validate.
	good := buckets.Reading{Device: "dev-0", Ticks: exampleTicks, Values: []buckets.Field{field("hum", buckets.Int(40)), field("x", buckets.Int(1))}}
	require.NoError(t, good.Validate())
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			requireInvalid(t, tc.r.ValidateAfter(&good), tc.code, tc.field, tc.msg)
			err := tc.r.Validate()
			ve := requireInvalid(t, err, tc.code, tc.field, tc.msg)
			assert.Equal(t, -1, ve.Index, "a single reading has no index")

			// The caller that knows the reading's place in its batch sets it,
			// and the message then names both the index and the field.
			ve.Index = 4
			assert.True(t, strings.HasPrefix(err.Error(), "reading 4: "+tc.field+": "), err.Error())
		})
	}
}

// ValidateAfter skips only what equals the valid reading before it: a
// name at another position, or a changed one, is checked.
func TestValidateAfterChecksWhatChanged(t *testing.T) {
	prev := reading(field("a", buckets.Int(1)), field("b", buckets.Int(2)))
	require.NoError(t, prev.Validate())
	same := reading(field("a", buckets.Int(3)), field("b", buckets.Int(4)))
	assert.NoError(t, same.ValidateAfter(&prev))
	moved := reading(field("b", buckets.Int(3)), field("b-", buckets.Int(4)))
	assert.NoError(t, moved.ValidateAfter(&prev))
	bad := reading(field("a", buckets.Int(3)), field("b!", buckets.Int(4)))
	requireInvalid(t, bad.ValidateAfter(&prev), buckets.CodeInvalidName, "values.b!", "only A-Z a-z 0-9 _ . - are allowed")
	longer := reading(field("a", buckets.Int(3)), field("b", buckets.Int(4)), field("c d", buckets.Int(5)))
	requireInvalid(t, longer.ValidateAfter(&prev), buckets.CodeInvalidName, "values.c d", "only A-Z")
	otherDevice := buckets.Reading{Device: "a.b", Ticks: exampleTicks, Values: prev.Values}
	requireInvalid(t, otherDevice.ValidateAfter(&prev), buckets.CodeInvalidDevice, "device", "has '.'")
	unsorted := reading(field("b", buckets.Int(3)), field("a", buckets.Int(4)))
	requireInvalid(t, unsorted.ValidateAfter(&prev), buckets.CodeDuplicateValue, "values.a", "unique")
}

func TestSortValues(t *testing.T) {
	fields := []buckets.Field{field("c", buckets.Int(3)), field("a", buckets.Int(1)), field("b", buckets.Int(2))}
	dup, ok := buckets.SortValues(fields)
	assert.True(t, ok)
	assert.Empty(t, dup)
	assert.Equal(t, []string{"a", "b", "c"}, names(fields))
	r := reading(fields...)
	require.NoError(t, r.Validate())
	v, found := r.Get("b")
	require.True(t, found)
	assert.Equal(t, int64(2), v.AsInt())
	_, found = r.Get("bb")
	assert.False(t, found)

	dup, ok = buckets.SortValues([]buckets.Field{field("x", buckets.Int(1)), field("a", buckets.Int(1)), field("x", buckets.Int(2))})
	assert.False(t, ok)
	assert.Equal(t, "x", dup)
}

func names(fields []buckets.Field) []string {
	out := make([]string, len(fields))
	for i, f := range fields {
		out[i] = f.Name
	}
	return out
}

func TestMerge(t *testing.T) {
	a1, b1, c1 := field("a", buckets.Int(1)), field("b", buckets.Float(1.5)), field("c", buckets.Bool(true))
	b2, d2 := field("b", buckets.String("new")), field("d", buckets.Int(4))
	tests := []struct {
		name     string
		old, upd []buckets.Field
		want     []buckets.Field
	}{
		{"disjoint", []buckets.Field{a1, c1}, []buckets.Field{b2, d2}, []buckets.Field{a1, b2, c1, d2}},
		{"overlapping: the update wins", []buckets.Field{a1, b1, c1}, []buckets.Field{b2}, []buckets.Field{a1, b2, c1}},
		{"identical names", []buckets.Field{b1}, []buckets.Field{b2}, []buckets.Field{b2}},
		{"empty old", nil, []buckets.Field{b2, d2}, []buckets.Field{b2, d2}},
		{"empty update", []buckets.Field{a1, b1}, nil, []buckets.Field{a1, b1}},
		{"both empty", nil, nil, []buckets.Field{}},
		{"same message twice is idempotent", []buckets.Field{a1, b1}, []buckets.Field{a1, b1}, []buckets.Field{a1, b1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			oldCopy := append([]buckets.Field(nil), tc.old...)
			updCopy := append([]buckets.Field(nil), tc.upd...)
			got := buckets.Merge(tc.old, tc.upd)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, oldCopy, tc.old, "old must not change")
			assert.Equal(t, updCopy, tc.upd, "update must not change")
			if len(got) > 0 {
				r := reading(got...)
				assert.NoError(t, r.Validate(), "merged values stay sorted and unique")
			}
		})
	}
}

func TestValueAccessors(t *testing.T) {
	assert.Equal(t, 21.5, buckets.Float(21.5).Any())
	assert.Equal(t, int64(-7), buckets.Int(-7).Any())
	assert.Equal(t, true, buckets.Bool(true).Any())
	assert.Equal(t, false, buckets.Bool(false).Any())
	assert.Equal(t, "x", buckets.String("x").Any())
	assert.Nil(t, buckets.Value{}.Any())
	assert.True(t, math.Signbit(buckets.Float(math.Copysign(0, -1)).AsFloat()))

	for k, want := range map[buckets.Kind]string{buckets.KindFloat: "float", buckets.KindInt: "int",
		buckets.KindBool: "bool", buckets.KindString: "string", 0: "kind(0)", 9: "kind(9)"} {
		assert.Equal(t, want, k.String())
	}
}

func TestWindowCheck(t *testing.T) {
	w := buckets.Window{Retention: 720 * time.Hour, MaxFutureSkew: 5 * time.Minute}
	for name, now := range map[string]time.Time{
		"clock on a tick":                  exampleTime,
		"clock between two ticks":          exampleTime.Add(50),
		"clock one nanosecond before tick": exampleTime.Add(99),
		"clock in another zone":            exampleTime.In(time.FixedZone("e", 5*3600)),
	} {
		t.Run(name, func(t *testing.T) {
			oldest := buckets.MustTicks(now.Add(-w.Retention))
			newest := buckets.MustTicks(now.Add(w.MaxFutureSkew))

			assert.NoError(t, w.Check(oldest, now), "exactly now - retention is accepted")
			assert.NoError(t, w.Check(newest, now), "exactly now + skew is accepted")
			assert.NoError(t, w.Check(buckets.MustTicks(now), now))

			err := w.Check(oldest-1, now)
			requireInvalid(t, err, buckets.CodeTooOld, "ts", "is older than the retention window (oldest accepted 2026-10-23T01:02:03.456")

			err = w.Check(newest+1, now)
			requireInvalid(t, err, buckets.CodeTooFarInFuture, "ts", "is more than 5m0s in the future (newest accepted 2026-11-22T01:07:03.456")
		})
	}
}

func TestWindowCheckMessages(t *testing.T) {
	w := buckets.Window{Retention: 24 * time.Hour, MaxFutureSkew: time.Minute}
	err := w.Check(mustTicks(t, "2026-11-20T00:00:00Z"), exampleTime)
	requireInvalid(t, err, buckets.CodeTooOld, "ts",
		"2026-11-20T00:00:00Z is older than the retention window (oldest accepted 2026-11-21T01:02:03.456Z)")
	err = w.Check(mustTicks(t, "2026-11-23T00:00:00Z"), exampleTime)
	requireInvalid(t, err, buckets.CodeTooFarInFuture, "ts",
		"2026-11-23T00:00:00Z is more than 1m0s in the future (newest accepted 2026-11-22T01:03:03.456Z)")
}
