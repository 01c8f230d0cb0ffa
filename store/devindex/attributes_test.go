package devindex

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func TestAssignAndDevice(t *testing.T) {
	ts := newTestIndex(t)
	_, err := ts.Device("truck-1")
	require.ErrorIs(t, err, buckets.ErrNotFound)

	ts.assign(t, set("truck-1", at(0), "fleet", "East", "model", "F-150"))
	di, err := ts.Device("truck-1")
	require.NoError(t, err)
	assert.Equal(t, attrs("fleet", "East", "model", "F-150"), di.Attributes)
	assert.Zero(t, di.FirstSeen, "no reading yet")
	assert.Zero(t, di.LastSeen)

	ts.write(t, reading("truck-1", at(time.Minute), "speed", 3.5))
	di, err = ts.Device("truck-1")
	require.NoError(t, err)
	assert.Equal(t, at(time.Minute), di.FirstSeen, "the first reading sets both bounds")
	assert.Equal(t, at(time.Minute), di.LastSeen)
	assert.Equal(t, attrs("fleet", "East", "model", "F-150"), di.Attributes)

	ts.write(t, reading("truck-2", at(0), "speed", 1.0))
	di, err = ts.Device("truck-2")
	require.NoError(t, err)
	assert.Empty(t, di.Attributes)

	ts = ts.reopen(t)
	assert.Equal(t, map[string]string{"fleet": "East", "model": "F-150"}, ts.attrsOf(t, "truck-1"))
	di, err = ts.Device("truck-1")
	require.NoError(t, err)
	assert.Equal(t, at(time.Minute), di.FirstSeen)
}
func TestAssignBoundaries(t *testing.T) {
	name64, name65 := "n"+strings.Repeat("x", 63), "n"+strings.Repeat("x", 64)
	value256, value257 := strings.Repeat("v", 256), strings.Repeat("v", 257)
	ok := []struct {
		name  string
		attrs buckets.Attributes
	}{
		{"name of 64 bytes", buckets.Attributes{{Name: name64, Value: "a"}}},
		{"value of 256 bytes", buckets.Attributes{{Name: "fleet", Value: value256}}},
		{"underscore first", buckets.Attributes{{Name: "_x", Value: "a"}}},
		{"single underscore then letters", buckets.Attributes{{Name: "_device", Value: "a"}}},
		{"multi-byte UTF-8", buckets.Attributes{{Name: "city", Value: "Zürich"}}},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestIndex(t)
			ts.assign(t, buckets.Assignment{Device: "d", At: at(0), Set: tc.attrs})
			assert.Equal(t, tc.attrs.Map(), ts.attrsOf(t, "d"))
		})
	}
	bad := []struct {
		name string
		a    buckets.Assignment
		code buckets.Code
	}{
		{"name of 65 bytes", buckets.Assignment{Device: "d", Set: buckets.Attributes{{Name: name65, Value: "a"}}}, buckets.CodeInvalidAttributeName},
		{"name device", buckets.Assignment{Device: "d", Set: buckets.Attributes{{Name: "device", Value: "a"}}}, buckets.CodeInvalidAttributeName},
		{"name __x", buckets.Assignment{Device: "d", Set: buckets.Attributes{{Name: "__x", Value: "a"}}}, buckets.CodeInvalidAttributeName},
		{"name with a dot", buckets.Assignment{Device: "d", Set: buckets.Attributes{{Name: "a.b", Value: "a"}}}, buckets.CodeInvalidAttributeName},
		{"name starting with a digit", buckets.Assignment{Device: "d", Set: buckets.Attributes{{Name: "1a", Value: "a"}}}, buckets.CodeInvalidAttributeName},
		{"empty name", buckets.Assignment{Device: "d", Set: buckets.Attributes{{Name: "", Value: "a"}}}, buckets.CodeInvalidAttributeName},
		{"value of 257 bytes", buckets.Assignment{Device: "d", Set: buckets.Attributes{{Name: "fleet", Value: value257}}}, buckets.CodeInvalidAttributeValue},
		{"empty value", buckets.Assignment{Device: "d", Set: buckets.Attributes{{Name: "fleet", Value: ""}}}, buckets.CodeInvalidAttributeValue},
		{"invalid UTF-8", buckets.Assignment{Device: "d", Set: buckets.Attributes{{Name: "fleet", Value: "\xff"}}}, buckets.CodeInvalidAttributeValue},
		{"unsorted set", buckets.Assignment{Device: "d", Set: buckets.Attributes{{Name: "b", Value: "1"}, {Name: "a", Value: "1"}}}, buckets.CodeInvalidAttributeName},
		{"removed name invalid", buckets.Assignment{Device: "d", Remove: []string{"__x"}}, buckets.CodeInvalidAttributeName},
		{"set and removed", buckets.Assignment{Device: "d", Set: attrs("a", "1"), Remove: []string{"a"}}, buckets.CodeInvalidAttributeName},
		{"bad device", buckets.Assignment{Device: "a/b", Set: attrs("a", "1")}, buckets.CodeInvalidDevice},
		{"65 attributes", buckets.Assignment{Device: "d", Set: manyAttrs(65)}, buckets.CodeTooManyAttributes},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestIndex(t)
			tc.a.At = at(0)
			err := ts.Assign([]buckets.Assignment{set("other", at(0), "a", "1"), tc.a})
			var ve *buckets.ValidationError
			require.True(t, errors.As(err, &ve), "error %v", err)
			assert.Equal(t, tc.code, ve.Code)
			_, err = ts.Device("other")
			assert.ErrorIs(t, err, buckets.ErrNotFound, "nothing of a refused call is applied")
		})
	}
}

// manyAttrs returns n attributes a00=v, a01=v, ...
func manyAttrs(n int) buckets.Attributes {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("a%02d", i)] = "v"
	}
	a := make(buckets.Attributes, 0, n)
	for i := range n {
		name := fmt.Sprintf("a%02d", i)
		a = append(a, buckets.Attribute{Name: name, Value: m[name]})
	}
	return a
}
func TestAssignAtMostMaxAttributes(t *testing.T) {
	ts := newTestIndex(t)
	ts.assign(t, buckets.Assignment{Device: "d", At: at(0), Set: manyAttrs(64)})
	assert.Len(t, ts.attrsOf(t, "d"), 64)

	// A PATCH that would make 65 is refused and changes nothing.
	err := ts.Assign([]buckets.Assignment{set("d", at(time.Second), "zz", "1")})
	var ve *buckets.ValidationError
	require.True(t, errors.As(err, &ve), "error %v", err)
	assert.Equal(t, buckets.CodeTooManyAttributes, ve.Code)
	assert.Contains(t, ve.Error(), "65")
	assert.Len(t, ts.attrsOf(t, "d"), 64)

	// Removing one and adding one in the same call fits.
	ts.assign(t, remove("d", at(time.Second), "a00"), set("d", at(time.Second), "zz", "1"))
	got := ts.attrsOf(t, "d")
	assert.Len(t, got, 64)
	assert.Equal(t, "1", got["zz"])
	assert.NotContains(t, got, "a00")

	// A PUT of 64 replaces them all.
	ts.assign(t, buckets.Assignment{Device: "d", At: at(2 * time.Second), Set: manyAttrs(64), Replace: true})
	got = ts.attrsOf(t, "d")
	assert.Len(t, got, 64)
	assert.NotContains(t, got, "zz")
}
func TestAssignPatchPutAndRemove(t *testing.T) {
	ts := newTestIndex(t)
	ts.assign(t, set("d", at(0), "fleet", "East", "model", "F-150"))
	ts.assign(t, set("d", at(time.Second), "color", "red"))
	assert.Equal(t, map[string]string{"fleet": "East", "model": "F-150", "color": "red"}, ts.attrsOf(t, "d"), "PATCH merges")
	ts.assign(t, remove("d", at(2*time.Second), "model", "never_set"))
	assert.Equal(t, map[string]string{"fleet": "East", "color": "red"}, ts.attrsOf(t, "d"), "null removes")
	ts.assign(t, put("d", at(3*time.Second), "fleet", "West"))
	assert.Equal(t, map[string]string{"fleet": "West"}, ts.attrsOf(t, "d"), "PUT replaces")
	ts.assign(t, put("d", at(4*time.Second)))
	assert.Empty(t, ts.attrsOf(t, "d"), "an empty PUT clears")
}
func TestLateAssignmentNeverRollsBack(t *testing.T) {
	t.Run("set", func(t *testing.T) {
		ts := newTestIndex(t)
		ts.assign(t, set("d", at(time.Minute), "fleet", "West"))
		ts.assign(t, set("d", at(0), "fleet", "East"))
		assert.Equal(t, map[string]string{"fleet": "West"}, ts.attrsOf(t, "d"))
	})
	t.Run("remove", func(t *testing.T) {
		ts := newTestIndex(t)
		ts.assign(t, remove("d", at(time.Minute), "fleet"))
		ts.assign(t, set("d", at(0), "fleet", "East"))
		assert.Empty(t, ts.attrsOf(t, "d"), "the older value arriving late stays removed")
		ts.assign(t, set("d", at(time.Hour), "fleet", "East"))
		ts.assign(t, remove("d", at(time.Minute+time.Second), "fleet"))
		assert.Equal(t, map[string]string{"fleet": "East"}, ts.attrsOf(t, "d"), "an older removal arriving late is ignored")
	})
	t.Run("replace", func(t *testing.T) {
		ts := newTestIndex(t)
		ts.assign(t, put("d", at(time.Minute), "fleet", "West"))
		ts.assign(t, set("d", at(0), "model", "F-150", "fleet", "East"))
		assert.Equal(t, map[string]string{"fleet": "West"}, ts.attrsOf(t, "d"), "names absent from a newer PUT stay absent")
		ts.assign(t, put("d", at(time.Second), "color", "red"))
		assert.Equal(t, map[string]string{"fleet": "West"}, ts.attrsOf(t, "d"), "an older PUT changes nothing")
		ts.assign(t, set("d", at(2*time.Minute), "model", "F-150"))
		ts.assign(t, put("d", at(90*time.Second), "color", "red"))
		assert.Equal(t, map[string]string{"model": "F-150", "color": "red"}, ts.attrsOf(t, "d"),
			"a PUT removes what is older than it and keeps what is newer")
	})
	t.Run("equal times", func(t *testing.T) {
		ts := newTestIndex(t)
		ts.assign(t, set("d", at(0), "fleet", "East"))
		ts.assign(t, set("d", at(0), "fleet", "A"))
		ts.assign(t, remove("d", at(0), "fleet"))
		assert.Equal(t, map[string]string{"fleet": "East"}, ts.attrsOf(t, "d"),
			"at equal times a value beats a removal and the greater value wins, whatever the order")
	})
	t.Run("survives restart", func(t *testing.T) {
		ts := newTestIndex(t)
		ts.assign(t, remove("d", at(time.Minute), "fleet"))
		ts.assign(t, put("d", at(time.Minute), "model", "X"))
		ts = ts.reopen(t)
		ts.assign(t, set("d", at(0), "fleet", "East", "color", "red"))
		assert.Equal(t, map[string]string{"model": "X"}, ts.attrsOf(t, "d"))
	})
}
func TestReapplyingIsIdempotent(t *testing.T) {
	ts := newTestIndex(t)
	as := []buckets.Assignment{
		set("d", at(0), "fleet", "East", "model", "F"),
		remove("d", at(time.Second), "model"),
		put("d", at(2*time.Second), "fleet", "West", "color", "red"),
	}
	ts.assign(t, as...)
	want := ts.attrsOf(t, "d")
	seq := ts.DB().MaxVersion()
	for range 3 {
		ts.assign(t, as...)
		for _, a := range as {
			ts.assign(t, a)
		}
	}
	assert.Equal(t, want, ts.attrsOf(t, "d"))
	assert.Equal(t, seq, ts.DB().MaxVersion(), "a repeated assignment writes nothing")
}
func TestTombstonesAreBounded(t *testing.T) {
	ts := newTestIndex(t)
	// Set and remove more names than tombstones are kept, each removal
	// newer than the last.
	n := maxTombstones + 10
	for i := range n {
		name := fmt.Sprintf("n%03d", i)
		ts.assign(t, set("d", at(time.Duration(2*i)*time.Second), name, "v"))
		ts.assign(t, remove("d", at(time.Duration(2*i+1)*time.Second), name))
	}
	r := ts.devices["d"].attrs
	assert.LessOrEqual(t, len(r.gone), maxTombstones)
	assert.Positive(t, r.floor, "forgotten removals raised the floor")
	// Every removed name still refuses a value older than its removal,
	// the forgotten ones included.
	for i := range n {
		name := fmt.Sprintf("n%03d", i)
		ts.assign(t, set("d", at(time.Duration(2*i)*time.Second), name, "late"))
	}
	assert.Empty(t, ts.attrsOf(t, "d"))
	ts = ts.reopen(t)
	assert.Empty(t, ts.attrsOf(t, "d"))
	ts.assign(t, set("d", at(time.Hour), "n000", "new"))
	assert.Equal(t, map[string]string{"n000": "new"}, ts.attrsOf(t, "d"))
}
func TestAssignSplitsABatchTooBigForOneTransaction(t *testing.T) {
	ts := newTestIndex(t)
	var as []buckets.Assignment
	size := 0
	for d := range 300 {
		var set buckets.Attributes
		for i := range buckets.MaxAttributes {
			set = append(set, buckets.Attribute{Name: fmt.Sprintf("a%02d", i), Value: fmt.Sprintf("%03d", d) + strings.Repeat("v", 250)})
			size += 2 * 260
		}
		as = append(as, buckets.Assignment{Device: buckets.DeviceID(fmt.Sprintf("d%03d", d)), At: at(0), Set: set})
	}
	require.Greater(t, int64(size), ts.DB().MaxBatchSize(), "the batch needs more than one transaction")
	ts.assign(t, as...)
	for _, a := range as {
		require.Equal(t, a.Set.Map(), ts.attrsOf(t, string(a.Device)))
	}
	require.NoError(t, ts.checkAttrIndex())
	ts = ts.reopen(t)
	require.NoError(t, ts.checkAttrIndex())
	devs, _, err := ts.Devices(context.Background(), buckets.DeviceQuery{Limit: 1000, Match: matchers(t, `{a05=~"29.*"}`)})
	require.NoError(t, err)
	assert.Len(t, devs, 10)
}

// TestAttributeGeneration counts the changes of attribute sets: an
// assignment that leaves the set as it was (a newer time of the same
// values) and a reading count none.
func TestAttributeGeneration(t *testing.T) {
	ts := newTestIndex(t)
	g := ts.AttributeGeneration()
	ts.assign(t, set("truck-1", at(0), "fleet", "East"))
	assert.Equal(t, g+1, ts.AttributeGeneration())
	ts.assign(t, set("truck-1", at(time.Minute), "fleet", "East"))
	ts.write(t, reading("truck-1", at(time.Minute), "speed", 3.5))
	assert.Equal(t, g+1, ts.AttributeGeneration(), "the same set")
	ts.assign(t, set("truck-1", at(2*time.Minute), "fleet", "West"))
	assert.Equal(t, g+2, ts.AttributeGeneration())
	require.NoError(t, ts.DeleteDevice("truck-1"))
	assert.Equal(t, g+3, ts.AttributeGeneration())
}
