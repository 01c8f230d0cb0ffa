package devindex

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// The attribute state of one index, applied to another, gives it the
// same attributes where it knew less, and keeps what it knew newer:
// each value, removal and replacement travels with its time.
func TestAttributeStateRebuildsOnAnotherIndex(t *testing.T) {
	a, b := newTestIndex(t), newTestIndex(t)
	a.assign(t,
		put("d1", at(time.Minute), "fleet", "East", "tag", "x"),
		remove("d1", at(2*time.Minute), "tag"),
		set("d2", at(time.Minute), "fleet", "West"),
		set("d3", at(time.Minute), "fleet", "North"))
	// b had d1 older (from a reading), d2 newer, d4 of its own.
	b.assign(t,
		set("d1", at(0), "fleet", "South", "tag", "y", "model", "R-1"),
		set("d2", at(5*time.Minute), "fleet", "Newer"),
		set("d4", at(0), "fleet", "Own"))

	keep := func(d buckets.DeviceID) bool { return d != "d3" }
	var all []buckets.Assignment
	var after buckets.DeviceID
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		as, next, more := a.AttributeState(after, 1, keep)
		all = append(all, as...)
		if !more {
			break
		}
		after = next
	}
	b.assign(t, all...)
	for dev, want := range map[buckets.DeviceID]buckets.Attributes{
		"d1": attrs("fleet", "East"), // replaced at 1m: model and tag of 0 go; tag removed at 2m
		"d2": attrs("fleet", "Newer"),
		"d4": attrs("fleet", "Own"),
	} {
		di, err := b.Device(dev)
		require.NoError(t, err)
		assert.Equal(t, want, di.Attributes, "%s", dev)
	}
	_, err := b.Device("d3")
	require.ErrorIs(t, err, buckets.ErrNotFound, "a device keep leaves out is not copied")

	// Applying it again changes nothing.
	b.assign(t, all...)
	di, err := b.Device("d1")
	require.NoError(t, err)
	assert.Equal(t, attrs("fleet", "East"), di.Attributes)
}
