package store

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// threeDays writes 10 readings of "dev" on each of the days today-2,
// today-1 and today (hourly from 01:00), plus noise from other devices
// whose IDs share a prefix, and returns the dev readings oldest first.
func threeDays(t *testing.T, ts *testStore) []buckets.Reading {
	t.Helper()
	var all []buckets.Reading
	for d := today - 2; d <= today; d++ {
		rs := series("dev", dayTick(d, time.Hour), time.Hour, 10)
		ts.write(t, rs...)
		ts.write(t, series("dev-2", dayTick(d, time.Hour), time.Hour, 3)...)
		ts.write(t, series("de", dayTick(d, time.Hour), time.Hour, 3)...)
		all = append(all, rs...)
	}
	return all
}

func reversed(rs []buckets.Reading) []buckets.Reading {
	out := slices.Clone(rs)
	slices.Reverse(out)
	return out
}

func TestLatestAcrossDaysNewestFirstAndStopsEarly(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	all := threeDays(t, ts)
	ts = ts.reopen(t) // every table closed

	got, err := ts.Latest(ctx, "dev", 4)
	require.NoError(t, err)
	assert.Equal(t, reversed(all)[:4], got)
	assert.True(t, ts.isOpen(today))
	assert.False(t, ts.isOpen(today-1), "tables not needed for n are not opened")
	assert.False(t, ts.isOpen(today-2))

	got, err = ts.Latest(ctx, "dev", 15)
	require.NoError(t, err)
	assert.Equal(t, reversed(all)[:15], got, "crosses into the previous day in order")
	assert.False(t, ts.isOpen(today-2), "stops as soon as n are found")

	got, err = ts.Latest(ctx, "dev", 1000)
	require.NoError(t, err)
	assert.Equal(t, reversed(all), got)
}

func TestLatestSkipsTablesOutsideDeviceBounds(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	ts.write(t, reading("old", dayTick(today-3, time.Hour), "v", 1))
	ts.write(t, reading("new", dayTick(today, time.Hour), "v", 2))
	ts.write(t, reading("mid", dayTick(today-1, time.Hour), "v", 3))
	ts = ts.reopen(t)

	got, err := ts.Latest(ctx, "unknown", 10)
	require.NoError(t, err)
	assert.Empty(t, got)
	for d := today - 3; d <= today; d++ {
		assert.False(t, ts.isOpen(d), "an unknown device opens nothing")
	}

	got, err = ts.Latest(ctx, "old", 10)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Reading{reading("old", dayTick(today-3, time.Hour), "v", 1)}, got)
	assert.True(t, ts.isOpen(today-3))
	assert.False(t, ts.isOpen(today), "a day after the device's last reading is not opened")
	assert.False(t, ts.isOpen(today-1))
}

func TestLatestRejectsNonPositiveN(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	_, err := ts.Latest(context.Background(), "dev", 0)
	assert.ErrorIs(t, err, buckets.ErrInvalidArgument)
}

func TestRangePagingReturnsEveryReadingOnce(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	all := threeDays(t, ts)
	for _, order := range []buckets.Order{buckets.Desc, buckets.Asc} {
		for _, limit := range []int{1, 7, 10, 30, 31} {
			t.Run(order.String(), func(t *testing.T) {
				q := buckets.RangeQuery{Device: "dev", From: (today - 2).Start(), To: today.End(), Order: order, Limit: limit}
				var got []buckets.Reading
				pages := 0
				for {
					p, err := ts.Range(ctx, q)
					require.NoError(t, err)
					require.LessOrEqual(t, len(p.Readings), limit)
					got = append(got, p.Readings...)
					pages++
					if !p.More {
						break
					}
					require.Len(t, p.Readings, limit, "a page with More is full")
					last := p.Readings[len(p.Readings)-1].Ticks
					q.After = &last
				}
				want := all
				if order == buckets.Desc {
					want = reversed(all)
				}
				assert.Equal(t, want, got)
				assert.Equal(t, (len(all)+limit-1)/limit, pages, "More is false exactly on the last page")
			})
		}
	}
}

func TestRangeBoundsAreFromInclusiveToExclusive(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	d := today - 1
	// Readings on both sides of a day boundary and at the bounds.
	ks := []buckets.Ticks{d.Start() - 1, d.Start(), d.Start() + 1, d.End() - 1, d.End(), d.End() + 1}
	for _, k := range ks {
		ts.write(t, reading("dev", k, "v", 1))
	}
	tests := []struct {
		name     string
		from, to buckets.Ticks
		want     []buckets.Ticks // ascending
	}{
		{"whole day", d.Start(), d.End(), []buckets.Ticks{d.Start(), d.Start() + 1, d.End() - 1}},
		{"from at a reading is included", d.Start() + 1, d.End() + 2, []buckets.Ticks{d.Start() + 1, d.End() - 1, d.End(), d.End() + 1}},
		{"to at a reading is excluded", d.Start() - 1, d.End(), []buckets.Ticks{d.Start() - 1, d.Start(), d.Start() + 1, d.End() - 1}},
		{"one tick", d.End(), d.End() + 1, []buckets.Ticks{d.End()}},
		{"empty", d.End(), d.End(), nil},
		{"inverted", d.End(), d.Start(), nil},
	}
	for _, tt := range tests {
		for _, order := range []buckets.Order{buckets.Asc, buckets.Desc} {
			t.Run(tt.name+"/"+order.String(), func(t *testing.T) {
				p, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: tt.from, To: tt.to, Order: order, Limit: 100})
				require.NoError(t, err)
				want := slices.Clone(tt.want)
				if order == buckets.Desc {
					slices.Reverse(want)
				}
				assert.Equal(t, want, nilIfEmpty(ticksOf(p.Readings)))
				assert.False(t, p.More)
			})
		}
	}
}

func nilIfEmpty(ks []buckets.Ticks) []buckets.Ticks {
	if len(ks) == 0 {
		return nil
	}
	return ks
}

func TestRangeLimitBoundary(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	rs := series("dev", at(-time.Hour), time.Second, 5)
	ts.write(t, rs...)
	q := buckets.RangeQuery{Device: "dev", From: at(-2 * time.Hour), To: at(time.Hour), Order: buckets.Asc}

	q.Limit = 5
	p, err := ts.Range(ctx, q)
	require.NoError(t, err)
	assert.Equal(t, rs, p.Readings)
	assert.False(t, p.More, "limit equal to the matches: no more")

	q.Limit = 4
	p, err = ts.Range(ctx, q)
	require.NoError(t, err)
	assert.Equal(t, rs[:4], p.Readings)
	assert.True(t, p.More, "one match past the limit: more")

	q.Limit = 0
	_, err = ts.Range(ctx, q)
	assert.ErrorIs(t, err, buckets.ErrInvalidArgument)
}

func TestRangeAfterBounds(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	rs := series("dev", at(0), 100*time.Nanosecond, 3) // consecutive ticks
	ts.write(t, rs...)
	q := buckets.RangeQuery{Device: "dev", From: at(-time.Hour), To: at(time.Hour), Limit: 10}

	after := rs[1].Ticks
	q.After, q.Order = &after, buckets.Desc
	p, err := ts.Range(ctx, q)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Ticks{rs[0].Ticks}, ticksOf(p.Readings), "desc: strictly older than After")

	q.Order = buckets.Asc
	p, err = ts.Range(ctx, q)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Ticks{rs[2].Ticks}, ticksOf(p.Readings), "asc: strictly newer than After")
}

func TestGet(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	r := reading("dev", dayTick(today-1, 5*time.Hour), "v", 1)
	ts.write(t, r, reading("dev", dayTick(today, time.Hour), "v", 2))

	got, err := ts.Get(ctx, "dev", r.Ticks)
	require.NoError(t, err)
	assert.Equal(t, r, got)

	for name, q := range map[string]struct {
		dev buckets.DeviceID
		k   buckets.Ticks
	}{
		"one tick later":           {"dev", r.Ticks + 1},
		"one tick earlier":         {"dev", r.Ticks - 1},
		"other device":             {"dev-2", r.Ticks},
		"prefix of device":         {"de", r.Ticks},
		"day without a table":      {"dev", dayTick(today-10, time.Hour)},
		"before the first reading": {"dev", r.Ticks - buckets.TicksPerDay},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ts.Get(ctx, q.dev, q.k)
			assert.ErrorIs(t, err, buckets.ErrNotFound)
		})
	}
}
