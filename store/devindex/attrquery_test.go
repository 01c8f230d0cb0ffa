package devindex

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// fleetStore holds trucks t1..t6 with fleets and models, and one
// device (s1) without attributes.
func fleetStore(t *testing.T) *testIndex {
	t.Helper()
	ts := newTestIndex(t)
	ts.assign(t,
		set("t1", at(0), "fleet", "East", "model", "F-150"),
		set("t2", at(0), "fleet", "East", "model", "F-250"),
		set("t3", at(0), "fleet", "West", "model", "F-150"),
		set("t4", at(0), "fleet", "West"),
		set("t5", at(0), "fleet", "North", "model", "X"),
		set("t6", at(0), "model", "F-150"),
	)
	ts.write(t, reading("s1", at(time.Minute), "v", 1), reading("t1", at(time.Hour), "v", 1))
	return ts
}

func TestDevicesMatch(t *testing.T) {
	ts := fleetStore(t)
	for _, tc := range []struct {
		sel  string
		want string
	}{
		{`{fleet="East"}`, "t1 t2"},
		{`{fleet="East",model="F-250"}`, "t2"},
		{`{fleet!="East"}`, "s1 t3 t4 t5 t6"},
		{`{fleet=~"East|West"}`, "t1 t2 t3 t4"},
		{`{fleet=~"E.*|N.*"}`, "t1 t2 t5"},
		{`{fleet!~"E.*"}`, "s1 t3 t4 t5 t6"},
		{`{fleet=""}`, "s1 t6"},
		{`{fleet!=""}`, "t1 t2 t3 t4 t5"},
		{`{fleet=~".*"}`, "s1 t1 t2 t3 t4 t5 t6"},
		{`{fleet=~".+"}`, "t1 t2 t3 t4 t5"},
		{`{fleet="South"}`, ""},
		{`{nosuch="x"}`, ""},
		{`{model=~"F-.*",fleet!="West"}`, "t1 t2 t6"},
		{`{model=~"F-.*",model!="F-150"}`, "t2"},
		{`{device="t3"}`, "t3"},
		{`{device="nosuch"}`, ""},
		{`{device=~"t1|t5|zz"}`, "t1 t5"},
		{`{device=~"t[2-4]",fleet="West"}`, "t3 t4"},
		{`{device!="t1",fleet="East"}`, "t2"},
	} {
		t.Run(tc.sel, func(t *testing.T) {
			devs, more, err := ts.Devices(context.Background(), buckets.DeviceQuery{Limit: 100, Match: matchers(t, tc.sel)})
			require.NoError(t, err)
			assert.False(t, more)
			var got []string
			for _, d := range devs {
				got = append(got, string(d.Device))
			}
			assert.Equal(t, tc.want, strings.Join(got, " "))
		})
	}
}

func TestDevicesMatchPagingSilenceAndVisibility(t *testing.T) {
	ts := fleetStore(t)
	ctx := context.Background()
	q := buckets.DeviceQuery{Limit: 1, Match: matchers(t, `{model=~"F-.*"}`)}
	var got []buckets.DeviceID
	for {
		devs, more, err := ts.Devices(ctx, q)
		require.NoError(t, err)
		got = append(got, ids(devs)...)
		if !more {
			break
		}
		q.After = devs[0].Device
	}
	assert.Equal(t, []buckets.DeviceID{"t1", "t2", "t3", "t6"}, got)

	devs, more, err := ts.Devices(ctx, buckets.DeviceQuery{Limit: 2, Match: matchers(t, `{fleet=~"East|West"}`), After: "t1"})
	require.NoError(t, err)
	assert.Equal(t, []buckets.DeviceID{"t2", "t3"}, ids(devs))
	assert.True(t, more)

	devs, _, err = ts.Devices(ctx, buckets.DeviceQuery{Limit: 10, Match: matchers(t, `{fleet="East"}`), SilentBefore: at(time.Minute)})
	require.NoError(t, err)
	assert.Equal(t, []buckets.DeviceID{"t2"}, ids(devs), "t1 sent a reading since; t2 never did")

	devs, _, err = ts.Devices(ctx, buckets.DeviceQuery{Limit: 10, Match: matchers(t, `{model="F-150"}`),
		Visible: func(d buckets.DeviceID) bool { return d != "t3" }})
	require.NoError(t, err)
	assert.Equal(t, []buckets.DeviceID{"t1", "t6"}, ids(devs))
	assert.Equal(t, attrs("fleet", "East", "model", "F-150"), devs[0].Attributes)
}

// TestPositiveMatcherDrivesFromPostings checks that a matcher that
// cannot match the empty string gives the candidates, the smallest set
// of them driving the listing, and that only empty-matching matchers
// fall back to every device.
func TestPositiveMatcherDrivesFromPostings(t *testing.T) {
	ts := newTestIndex(t)
	var as []buckets.Assignment
	for i := range 1000 {
		fleet := "West"
		if i%100 == 0 {
			fleet = "East"
		}
		as = append(as, set(fmt.Sprintf("d%04d", i), at(0), "fleet", fleet, "model", fmt.Sprintf("M%d", i%5)))
	}
	ts.assign(t, as...)
	x := ts.Index
	for _, tc := range []struct {
		sel  string
		size int
	}{
		{`{fleet="East"}`, 10},
		{`{fleet="East",model=~"M.*"}`, 10},
		{`{model=~"M1|M2",fleet=~"East"}`, 10},
		{`{model=~"M1|M2"}`, 400},
		{`{model=~"M[12]"}`, 400},
		{`{model!=""}`, 1000},
		{`{fleet="South"}`, 0},
		{`{device="d0001",fleet="West"}`, 1},
	} {
		q := buckets.DeviceQuery{Match: matchers(t, tc.sel)}
		d := x.driver(&q)
		require.NotNil(t, d, tc.sel)
		assert.Equal(t, tc.size, d.size, tc.sel)
	}
	for _, sel := range []string{`{fleet!="East"}`, `{fleet=~".*"}`, `{fleet=""}`, `{device=~"d.*"}`} {
		q := buckets.DeviceQuery{Match: matchers(t, sel)}
		assert.Nil(t, x.driver(&q), sel)
	}
	devs, _, err := ts.Devices(context.Background(), buckets.DeviceQuery{Limit: 5, Match: matchers(t, `{fleet="East"}`), After: "d0100"})
	require.NoError(t, err)
	assert.Equal(t, []buckets.DeviceID{"d0200", "d0300", "d0400", "d0500", "d0600"}, ids(devs))
}

func TestAttributeNamesAndValues(t *testing.T) {
	ts := fleetStore(t)
	ctx := context.Background()
	names, err := ts.AttributeNames(ctx, buckets.DeviceQuery{})
	require.NoError(t, err)
	assert.Equal(t, []string{"fleet", "model"}, names)
	vals, err := ts.AttributeValues(ctx, "fleet", buckets.DeviceQuery{})
	require.NoError(t, err)
	assert.Equal(t, []string{"East", "North", "West"}, vals)
	vals, err = ts.AttributeValues(ctx, "nosuch", buckets.DeviceQuery{})
	require.NoError(t, err)
	assert.Empty(t, vals)

	onlyT3T4 := func(d buckets.DeviceID) bool { return d == "t3" || d == "t4" }
	vals, err = ts.AttributeValues(ctx, "fleet", buckets.DeviceQuery{Visible: onlyT3T4})
	require.NoError(t, err)
	assert.Equal(t, []string{"West"}, vals, "a value is listed only when a visible device has it")
	vals, err = ts.AttributeValues(ctx, "model", buckets.DeviceQuery{Visible: func(d buckets.DeviceID) bool { return d == "t4" }})
	require.NoError(t, err)
	assert.Empty(t, vals)
	names, err = ts.AttributeNames(ctx, buckets.DeviceQuery{Visible: func(d buckets.DeviceID) bool { return d == "t4" }})
	require.NoError(t, err)
	assert.Equal(t, []string{"fleet"}, names)

	vals, err = ts.AttributeValues(ctx, "model", buckets.DeviceQuery{Match: matchers(t, `{fleet="East"}`)})
	require.NoError(t, err)
	assert.Equal(t, []string{"F-150", "F-250"}, vals)
	names, err = ts.AttributeNames(ctx, buckets.DeviceQuery{Match: matchers(t, `{fleet="West"}`), Prefix: "t4"})
	require.NoError(t, err)
	assert.Equal(t, []string{"fleet"}, names)

	// A removed value disappears from the lists.
	ts.assign(t, remove("t5", at(time.Second), "fleet"))
	vals, err = ts.AttributeValues(ctx, "fleet", buckets.DeviceQuery{})
	require.NoError(t, err)
	assert.Equal(t, []string{"East", "West"}, vals)
}

func TestLongWalkStopsWhenItsContextEnds(t *testing.T) {
	ts := newTestIndex(t)
	var as []buckets.Assignment
	for i := range 3 * walkCheckEvery {
		as = append(as, set(fmt.Sprintf("d%05d", i), at(0), "fleet", "East"))
	}
	ts.assign(t, as...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	hide := func(buckets.DeviceID) bool { calls++; cancel(); return false }
	_, _, err := ts.Devices(ctx, buckets.DeviceQuery{Limit: 10, Match: matchers(t, `{fleet!="West"}`), Visible: hide})
	require.ErrorIs(t, err, context.Canceled)
	assert.LessOrEqual(t, calls, walkCheckEvery)

	ctx, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	hide = func(buckets.DeviceID) bool { calls++; cancel2(); return false }
	calls = 0
	_, err = ts.AttributeValues(ctx, "fleet", buckets.DeviceQuery{Visible: hide})
	require.ErrorIs(t, err, context.Canceled)
	assert.LessOrEqual(t, calls, walkCheckEvery)
}
