package promapi

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// liveFixture is a real store with three devices sending every 15 s
// for ten minutes, an API whose batches use the live window and one
// that reads the store for every query, for comparison.
type liveFixture struct {
	t             *testing.T
	st            *store.Store
	src           *readCountingStore
	shared, plain *API
	t0            time.Time
}

func newLiveFixture(t *testing.T, devices int) *liveFixture {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	st := openStoreAt(t, t0.Add(time.Hour))
	f := &liveFixture{t: t, st: st, src: &readCountingStore{countedStore: countedStore{Store: st}}, t0: t0}
	var rs []buckets.Reading
	for i := range 40 {
		at := t0.Add(time.Duration(i) * 15 * time.Second)
		for d := range devices {
			rs = append(rs, f.reading(fmt.Sprintf("d%d", d), at, float64(20+d+i%7), float64(40+i%5)))
		}
	}
	f.write(rs...)
	now := func() time.Time { return t0.Add(10 * time.Minute) }
	var err error
	f.shared, err = New(Config{Source: f.src, Now: now})
	require.NoError(t, err)
	require.NotNil(t, f.shared.q.live, "the store tells of its commits")
	f.plain, err = New(Config{Source: f.src, Now: now})
	require.NoError(t, err)
	return f
}

func (f *liveFixture) reading(dev string, at time.Time, temp, hum float64) buckets.Reading {
	return buckets.Reading{Device: buckets.DeviceID(dev), Ticks: buckets.MustTicks(at),
		Values: []buckets.Field{{Name: "hum", Value: buckets.Float(hum)}, {Name: "temp", Value: buckets.Float(temp)}}}
}

func (f *liveFixture) write(rs ...buckets.Reading) {
	f.t.Helper()
	require.NoError(f.t, f.st.Write(context.Background(), rs))
}

// reads is how many store reads (projected and raw) fn made.
func (f *liveFixture) reads(fn func()) int64 {
	n := f.src.samples.Load() + f.src.ranges.Load()
	fn()
	return f.src.samples.Load() + f.src.ranges.Load() - n
}

var liveQueries = []string{
	`temp`, `hum > 41`, `avg_over_time(temp[5m])`, `rate(temp[5m])`, `timestamp(temp)`,
	`sum by (device) (temp)`, `count_over_time(hum[2m])`, `temp offset 1m`, `temp offset 20m`,
	`max_over_time(temp[10m])`, `max_over_time(temp[1h:1m])`, `time() - telemetry_device_last_seen_timestamp_seconds`,
}

// same checks that one batch answers each query as the API without
// batches does.
func (f *liveFixture) same(ts time.Time) {
	f.t.Helper()
	batch := SharedReads(context.Background())
	for _, q := range liveQueries {
		want, err := f.plain.Instant(context.Background(), q, ts)
		require.NoError(f.t, err, q)
		got, err := f.shared.Instant(batch, q, ts)
		require.NoError(f.t, err, q)
		assert.Equal(f.t, sortedVector(want), sortedVector(got), "%s at %s", q, ts.Format(time.TimeOnly))
	}
}

// TestLiveWindow: batches read each device from the store once, then
// follow the store's commits: later batches read nothing however the
// devices send (new, late, same-millisecond and rewritten readings, a
// value that stops being a number), and answer exactly as queries
// without a batch; a deleted device is forgotten.
func TestLiveWindow(t *testing.T) {
	f := newLiveFixture(t, 3)
	counted := []string{`temp > 0`, `hum > 0`, `avg_over_time(temp[5m])`, `temp < 100`,
		`time() - telemetry_device_last_seen_timestamp_seconds > 0`}
	run := func(ts time.Time) int64 {
		batch := SharedReads(context.Background())
		return f.reads(func() {
			for _, q := range counted {
				_, err := f.shared.Instant(batch, q, ts)
				require.NoError(t, err)
			}
		})
	}
	ts := f.t0.Add(9*time.Minute + 50*time.Second)
	assert.EqualValues(t, 3, run(ts), "one read per device")
	f.same(ts)

	// Every device sends; d1 also late, twice in one millisecond, and
	// rewrites a reading; d2's hum stops being a number.
	next := f.t0.Add(10 * time.Minute)
	f.write(f.reading("d0", next, 50, 50), f.reading("d1", next, 51, 51), f.reading("d2", next, 52, 52))
	f.write(f.reading("d1", f.t0.Add(9*time.Minute+52*time.Second), 1000, 1000))
	f.write(f.reading("d1", next.Add(time.Second), 60, 60), f.reading("d1", next.Add(time.Second+100*time.Microsecond), 61, 61))
	f.write(f.reading("d1", f.t0.Add(9*time.Minute+45*time.Second), -5, -5))
	f.write(buckets.Reading{Device: "d2", Ticks: buckets.MustTicks(next), Values: []buckets.Field{{Name: "hum", Value: buckets.String("wet")}}})
	for _, at := range []time.Time{ts, next, next.Add(time.Second), next.Add(5 * time.Second)} {
		assert.Zero(t, run(at), "at %s", at.Format(time.TimeOnly))
		f.same(at)
	}
	v, err := f.shared.Instant(SharedReads(context.Background()), `max_over_time(temp{device="d1"}[5m])`, ts.Add(5*time.Second))
	require.NoError(t, err)
	require.Len(t, v, 1)
	assert.Equal(t, 1000.0, v[0].F, "the late reading is seen at once")

	// The last-seen series at a time before a device's newest reading
	// comes from the window too.
	assert.Zero(t, f.reads(func() {
		_, err := f.shared.Instant(SharedReads(context.Background()), `time() - telemetry_device_last_seen_timestamp_seconds`, ts)
		require.NoError(t, err)
	}))

	// d0's attributes change: its series are labelled anew.
	for _, fleet := range []string{"a", "b"} {
		set, bad := buckets.NewAttributes(map[string]string{"fleet": fleet})
		require.Nil(t, bad)
		require.NoError(t, f.st.Assign(context.Background(), []buckets.Assignment{{Device: "d0", At: buckets.MustTicks(f.t0), Set: set}}))
		v, err := f.shared.Instant(SharedReads(context.Background()), `temp{device="d0"}`, next)
		require.NoError(t, err)
		require.Len(t, v, 1)
		assert.Equal(t, fleet, v[0].Metric.Get("fleet"))
		f.same(next)
	}

	// A deleted device is forgotten: read again (and gone).
	_, err = f.st.DeleteDevice(context.Background(), "d0")
	require.NoError(t, err)
	f.same(next.Add(5 * time.Second))
	f.shared.q.live.mu.Lock()
	assert.NotContains(t, f.shared.q.live.devs, buckets.DeviceID("d0"))
	f.shared.q.live.mu.Unlock()
}

// TestLiveWindowBound: the window holds at most its bound of samples
// and reading times; the devices past it are read from the store, with
// the same answers.
func TestLiveWindowBound(t *testing.T) {
	f := newLiveFixture(t, 5)
	ts := f.t0.Add(9*time.Minute + 50*time.Second)
	f.same(ts)
	w := f.shared.q.live
	w.mu.Lock()
	one := w.devs["d0"].n // the same for every device
	held := len(w.devs)
	w.mu.Unlock()
	require.Equal(t, 5, held)

	// Room for exactly two devices.
	w.mu.Lock()
	clear(w.devs)
	w.n, w.max = 0, 2*one
	w.mu.Unlock()
	f.same(ts)
	w.mu.Lock()
	assert.Len(t, w.devs, 2)
	assert.Equal(t, 2*one, w.n)
	w.mu.Unlock()
	batch := SharedReads(context.Background())
	n := f.reads(func() {
		_, err := f.shared.Instant(batch, `temp{device=~"d0|d1"}`, ts)
		require.NoError(t, err)
	})
	assert.Zero(t, n, "the two devices held are read from the window")

	// A commit past the bound lets its device go.
	f.write(f.reading("d0", f.t0.Add(10*time.Minute), 1, 1))
	w.mu.Lock()
	assert.LessOrEqual(t, w.n, w.max)
	assert.Len(t, w.devs, 1)
	w.mu.Unlock()
	f.same(f.t0.Add(10 * time.Minute))
}

// TestLiveWindowWithinBatch: the selects of one batch look each device
// up in the window once, and again after the window let devices go: a
// select after that sees what the store holds, not what the window
// held before.
func TestLiveWindowWithinBatch(t *testing.T) {
	f := newLiveFixture(t, 3)
	ts := f.t0.Add(9*time.Minute + 50*time.Second)
	_, err := f.shared.Instant(SharedReads(context.Background()), `temp`, ts) // the window reads them
	require.NoError(t, err)
	batch := SharedReads(context.Background())
	assert.Zero(t, f.reads(func() {
		for _, q := range []string{`hum > 0`, `temp < 100`} {
			_, err := f.shared.Instant(batch, q, ts)
			require.NoError(t, err)
		}
	}), "the devices held are read from the window")

	// The window lets go of every device (as when a table is dropped),
	// then d1 rewrites a reading in the span kept.
	f.shared.q.live.removed("")
	f.write(f.reading("d1", f.t0.Add(9*time.Minute+30*time.Second), 1000, 1000))
	q := `max_over_time(temp[5m])`
	want, err := f.plain.Instant(context.Background(), q, ts)
	require.NoError(t, err)
	got, err := f.shared.Instant(batch, q, ts)
	require.NoError(t, err)
	assert.Equal(t, sortedVector(want), sortedVector(got))
	assert.Contains(t, fmt.Sprint(got), "1000", "the rewritten reading is seen")
}
