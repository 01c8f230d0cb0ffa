package promapi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// TestSharedReads: without the live window (a source that does not
// tell of its commits, the cluster's), the queries of SharedReads
// batches answer exactly as queries without one, over a real store; a batch reads each device
// once for all its value names, however many queries select it, and a
// later batch reads again only the devices that sent something since
// (and sees what they sent); a reading that arrives late, with a time
// before the device's newest, is seen once the evaluation time has
// moved recentMaxAge past the read.
func TestSharedReads(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	st := openStoreAt(t, t0.Add(time.Hour))
	reading := func(dev string, at time.Time, temp, hum float64) buckets.Reading {
		return buckets.Reading{Device: buckets.DeviceID(dev), Ticks: buckets.MustTicks(at),
			Values: []buckets.Field{{Name: "hum", Value: buckets.Float(hum)}, {Name: "temp", Value: buckets.Float(temp)}}}
	}
	var rs []buckets.Reading
	for i := range 40 { // ten minutes, every 15 s
		at := t0.Add(time.Duration(i) * 15 * time.Second)
		for d := range 3 {
			rs = append(rs, reading(fmt.Sprintf("d%d", d), at, float64(20+d+i%7), float64(40+i%5)))
		}
	}
	require.NoError(t, st.Write(context.Background(), rs))
	src := &readCountingStore{countedStore: countedStore{Store: st}}
	now := t0.Add(10 * time.Minute)
	shared, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)
	shared.q.live = nil // the reads kept without the live window (TestLiveWindow)
	plain, err := New(Config{Source: src, Now: func() time.Time { return now }})
	require.NoError(t, err)

	queries := []string{
		`temp`, `hum > 41`, `avg_over_time(temp[5m])`, `rate(temp[5m])`, `timestamp(temp)`,
		`sum by (device) (temp)`, `count_over_time(hum[2m])`, `temp offset 1m`,
		`max_over_time(temp[10m])`, `max_over_time(temp[1h:1m])`, `time() - telemetry_device_last_seen_timestamp_seconds`,
	}
	same := func(batch context.Context, ts time.Time) {
		t.Helper()
		for _, q := range queries {
			want, err := plain.Instant(context.Background(), q, ts)
			require.NoError(t, err, q)
			got, err := shared.Instant(batch, q, ts)
			require.NoError(t, err, q)
			assert.Equal(t, sortedVector(want), sortedVector(got), "%s at %s", q, ts.Format(time.TimeOnly))
		}
	}
	reads := func(f func()) int64 {
		n := src.samples.Load()
		f()
		return src.samples.Load() - n
	}

	// One batch: one read per device for four queries; what they
	// answer and what the rest answer is what they answer alone.
	counted := []string{`temp > 0`, `hum > 0`, `avg_over_time(temp[5m])`, `temp < 100`}
	run := func(batch context.Context, ts time.Time) int64 {
		return reads(func() {
			for _, q := range counted {
				_, err := shared.Instant(batch, q, ts)
				require.NoError(t, err)
			}
		})
	}
	ts := t0.Add(9*time.Minute + 50*time.Second)
	batch := SharedReads(context.Background())
	assert.EqualValues(t, 3, run(batch, ts), "one read per device for four queries")
	same(batch, ts)

	// A later batch: nothing was sent, nothing is read.
	ts = ts.Add(5 * time.Second)
	assert.Zero(t, run(SharedReads(context.Background()), ts))
	same(SharedReads(context.Background()), ts)

	// d2 sends a reading timed before the first batch's read: a query
	// at that batch's time sees it.
	first := t0.Add(9*time.Minute + 50*time.Second)
	require.NoError(t, st.Write(context.Background(), []buckets.Reading{reading("d2", first.Add(-time.Second), 77, 77)}))
	v, err := shared.Instant(SharedReads(context.Background()), `temp{device="d2"}`, first)
	require.NoError(t, err)
	require.Len(t, v, 1)
	assert.Equal(t, 77.0, v[0].F)

	// d1 sends: the next batch reads d1 again, and only d1, and sees
	// what it sent.
	require.NoError(t, st.Write(context.Background(), []buckets.Reading{reading("d1", ts.Add(time.Second), 99, 99)}))
	ts = ts.Add(2 * time.Second)
	assert.EqualValues(t, 1, run(SharedReads(context.Background()), ts))
	same(SharedReads(context.Background()), ts)
	v, err = shared.Instant(SharedReads(context.Background()), `temp{device="d1"}`, ts)
	require.NoError(t, err)
	require.Len(t, v, 1)
	assert.Equal(t, 99.0, v[0].F)

	// d0's attributes change: the next batch labels its series anew.
	assign := func(fleet string) {
		set, bad := buckets.NewAttributes(map[string]string{"fleet": fleet})
		require.Nil(t, bad)
		require.NoError(t, st.Assign(context.Background(), []buckets.Assignment{{Device: "d0", At: buckets.MustTicks(t0), Set: set}}))
	}
	fleetOf := func() string {
		v, err := shared.Instant(SharedReads(context.Background()), `temp{device="d0"}`, ts)
		require.NoError(t, err)
		require.Len(t, v, 1)
		return v[0].Metric.Get("fleet")
	}
	assign("a")
	assert.Equal(t, "a", fleetOf())
	assign("b")
	assert.Equal(t, "b", fleetOf())
	same(SharedReads(context.Background()), ts)

	// A late reading of d2, older than its newest: unseen by the
	// reads kept, seen once the evaluation time is recentMaxAge on.
	late := reading("d2", t0.Add(9*time.Minute+40*time.Second), 1000, 1000)
	require.NoError(t, st.Write(context.Background(), []buckets.Reading{late}))
	maxOf := func(at time.Time) float64 {
		v, err := shared.Instant(SharedReads(context.Background()), `max_over_time(temp{device="d2"}[5m])`, at)
		require.NoError(t, err)
		require.Len(t, v, 1)
		return v[0].F
	}
	assert.Less(t, maxOf(ts), 1000.0, "the kept read is used")
	later := ts.Add(time.Duration(recentMaxAge)*100 + time.Second)
	assert.Equal(t, 1000.0, maxOf(later), "the late reading is seen recentMaxAge on")
	same(SharedReads(context.Background()), later)
}

// sortedVector is v sorted by labels, for comparison.
func sortedVector(v promql.Vector) promql.Vector {
	out := slices.Clone(v)
	slices.SortFunc(out, func(a, b promql.Sample) int { return labels.Compare(a.Metric, b.Metric) })
	return out
}

// openStoreAt opens a store in a temporary directory, closed with the
// test, whose clock stands at now.
func openStoreAt(t *testing.T, now time.Time) *store.Store {
	t.Helper()
	o := store.DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Now = func() time.Time { return now }
	st, err := store.Open(context.Background(), t.TempDir(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}
