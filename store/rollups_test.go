package store

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/retention"
	"github.com/telemetryd/telemetryd/store/rollup"
)

// withRollups turns on the rollups 1m:90d,1h:3y.
func withRollups(o *Options) {
	o.Rollups = []rollup.Level{{Interval: time.Minute, Retention: 90 * rollup.Day}, {Interval: time.Hour, Retention: 3 * rollup.Year}}
}

// rollupSeries is n readings of dev from k0, one per step: a decimal
// float, a float that is not decimal, an int, a bool and a string.
func rollupSeries(dev string, k0 buckets.Ticks, step time.Duration, i0, n int) []buckets.Reading {
	rs := make([]buckets.Reading, n)
	for j := range rs {
		i := i0 + j
		rs[j] = reading(dev, k0+buckets.Ticks(j)*buckets.Ticks(step/100),
			"temp", 20+0.1*float64(i%97), "load", math.Sin(float64(i))*3.7, "n", int64(i), "ok", i%3 == 0, "mode", "auto")
	}
	return rs
}

// rollupQueries are the aggregate queries compared before and after
// the raw days go.
func rollupQueries(dev buckets.DeviceID, from, to buckets.Ticks) map[string]buckets.AggregateQuery {
	h := buckets.Ticks(time.Hour / 100)
	return map[string]buckets.AggregateQuery{
		"1h over 30 days":             {Device: dev, From: from, To: to, Interval: h, Limit: 10000},
		"1h per millisecond":          {Device: dev, From: from, To: to, Interval: h, Limit: 10000, PerMillisecond: true},
		"1m over a day, one field":    {Device: dev, From: from + 3*24*h, To: from + 4*24*h, Interval: h / 60, Limit: 10000, Fields: []string{"load"}},
		"1d over 30 days":             {Device: dev, From: from, To: to, Interval: 24 * h, Limit: 10000},
		"1h, paged after 100 buckets": {Device: dev, From: from, To: to, Interval: h, Limit: 100},
	}
}

// TestRollupsAnswerAsTheRawDaysDidAfterTheyAreDropped writes 30 days of
// a device at one reading per 10 s, takes aggregates from the day tables
// alone, and takes them again with rollups on while the day tables are
// there and after retention dropped them: every answer is the same, bit
// for bit.
func TestRollupsAnswerAsTheRawDaysDidAfterTheyAreDropped(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("writes 259,200 readings")
	}
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	first := today - 31
	from, to := first.Start(), (first + 30).Start()
	k0 := from + 5*buckets.TicksPerSecond // no reading at the start of a millisecond bucket
	const perHour = 360
	for h := range 30 * 24 {
		ts.write(t, rollupSeries("dev-1", k0+buckets.Ticks(h)*buckets.Ticks(time.Hour/100), 10*time.Second, h*perHour, perHour)...)
		ts.compactAll(false)
	}
	ts.compactAll(true)

	raw := ts.reopen(t, func(o *Options) { o.Rollups = nil })
	qs := rollupQueries("dev-1", from, to)
	want := make(map[string]buckets.AggregatePage)
	for name, q := range qs {
		p, err := raw.Aggregate(ctx, q)
		require.NoError(t, err, name)
		require.NotEmpty(t, p.Buckets, name)
		want[name] = p
	}
	require.Len(t, want["1h over 30 days"].Buckets, 30*24)

	ts = raw.reopen(t, withRollups)
	for name, q := range qs {
		p, err := ts.Aggregate(ctx, q)
		require.NoError(t, err, name)
		assert.Equal(t, want[name], p, "%s, day tables there", name)
	}

	w, err := retention.NewWorker(ts, retention.Config{Policy: retention.Policy{Retention: 24 * time.Hour}, Now: ts.clock.Now, Logger: ts.opts.Logger})
	require.NoError(t, err)
	drops, err := w.RunOnce(ctx, false)
	require.NoError(t, err)
	require.Len(t, drops.Dropped, 30)
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	require.Empty(t, tables)

	for name, q := range qs {
		p, err := ts.Aggregate(ctx, q)
		require.NoError(t, err, name)
		assert.Equal(t, want[name], p, "%s, day tables dropped", name)
	}
	// and after a restart
	ts = ts.reopen(t)
	p, err := ts.Aggregate(ctx, qs["1h over 30 days"])
	require.NoError(t, err)
	assert.Equal(t, want["1h over 30 days"], p)
}

// TestRollupsFollowALateReadingIntoAClosedWindow: a reading that
// arrives after its hour was rolled up is merged by the next compaction,
// which writes that hour's rollups again.
func TestRollupsFollowALateReadingIntoAClosedWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	h := buckets.Ticks(time.Hour / 100)
	k0 := today.Start() + 5*buckets.TicksPerSecond
	for i := range 3 {
		ts.write(t, rollupSeries("dev-1", k0+buckets.Ticks(i)*h, 10*time.Second, i*360, 360)...)
		ts.compactAll(false)
	}
	hourly := func() buckets.Summary {
		var got buckets.Summary
		n := 0
		require.NoError(t, ts.rollups.set.Scan(ctx, 1, "dev-1", today.Start(), today.Start()+h, func(b rollup.Bucket) error {
			n++
			for _, v := range b.Values {
				if v.Name == "temp" {
					got = v.Summary
				}
			}
			return nil
		}))
		require.Equal(t, 1, n)
		return got
	}
	before := hourly()
	require.Equal(t, int64(360), before.Count)

	ts.write(t, reading("dev-1", k0+7*buckets.TicksPerSecond, "temp", 1000.0)) // between two readings of hour 0
	ts.compactAll(false)
	after := hourly()
	assert.Equal(t, int64(361), after.Count)
	assert.Equal(t, 1000.0, after.Max)
	assert.InDelta(t, before.Sum+1000, after.Sum, 1e-9)

	p, err := ts.Aggregate(ctx, buckets.AggregateQuery{Device: "dev-1", From: today.Start(), To: today.Start() + h, Interval: h, Limit: 10, Fields: []string{"temp"}})
	require.NoError(t, err)
	require.Len(t, p.Buckets, 1)
	assert.Equal(t, after, p.Buckets[0].Values[0].Summary)
}

// TestDeleteDeviceRollupsLeavesOtherDevices: a device's rollups go
// with it when it is deleted; another device's stay.
func TestDeleteDeviceRollupsLeavesOtherDevices(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	h := buckets.Ticks(time.Hour / 100)
	k0 := today.Start() + 5*buckets.TicksPerSecond
	for i := range 3 {
		for _, dev := range []string{"a", "b"} {
			ts.write(t, rollupSeries(dev, k0+buckets.Ticks(i)*h, time.Minute, i*60, 60)...)
		}
		ts.compactAll(false)
	}
	count := func(dev buckets.DeviceID) int {
		n := 0
		require.NoError(t, ts.rollups.set.Scan(ctx, 1, dev, today.Start(), today.End(), func(rollup.Bucket) error { n++; return nil }))
		return n
	}
	require.Equal(t, 2, count("a"))
	_, err := ts.DeleteDevice(ctx, "a")
	require.NoError(t, err)
	assert.Zero(t, count("a"))
	assert.Equal(t, 2, count("b"))
	m, err := ts.rollups.w.Mark("a", today)
	require.NoError(t, err)
	assert.Equal(t, buckets.Ticks(-1), m, "the mark goes too")
}

// TestAWideDeviceIsRolledUpWhole: an hour of a device with 200 values
// at 1m (a record larger than a memtable's share of a transaction,
// which Badger keeps in its value log) is rolled up whole before its
// day is dropped.
func TestAWideDeviceIsRolledUpWhole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t, withRollups)
	day := today - 3
	k0 := day.Start() + 5*buckets.TicksPerSecond
	wide := make([]buckets.Reading, 60)
	for i := range wide {
		kv := make([]any, 0, 400)
		for j := range 200 {
			kv = append(kv, fmt.Sprintf("value_%03d", j), float64(i*j)+0.5)
		}
		wide[i] = reading("wide", k0+buckets.Ticks(i)*buckets.Ticks(time.Minute/100), kv...)
	}
	ts.write(t, wide...)
	_, err := ts.DropTable(ctx, day)
	require.NoError(t, err)
	n, names := 0, 0
	require.NoError(t, ts.rollups.set.Scan(ctx, 0, "wide", day.Start(), day.End(), func(b rollup.Bucket) error {
		n++
		names += len(b.Values)
		return nil
	}))
	assert.Equal(t, 60, n)
	assert.Equal(t, 60*200, names)
}
