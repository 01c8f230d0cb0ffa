package store

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// deviceView is everything the store answers about one device.
type deviceView struct {
	readings []buckets.Reading
	latest   []buckets.Reading
	info     buckets.DeviceInfo
	infoErr  error
}

func viewDevice(t *testing.T, ts *testStore, dev string) deviceView {
	t.Helper()
	ctx := context.Background()
	page, err := ts.Range(ctx, buckets.RangeQuery{Device: buckets.DeviceID(dev), From: 0, To: buckets.MaxTicks,
		Order: buckets.Asc, Limit: 100_000})
	require.NoError(t, err)
	latest, err := ts.Latest(ctx, buckets.DeviceID(dev), 5)
	require.NoError(t, err)
	info, err := ts.Device(ctx, buckets.DeviceID(dev))
	return deviceView{readings: page.Readings, latest: latest, info: info, infoErr: err}
}

// tableCounts is the reading count of every table.
func tableCounts(t *testing.T, ts *testStore) map[buckets.Day]int64 {
	t.Helper()
	tables, err := ts.Tables(context.Background())
	require.NoError(t, err)
	out := map[buckets.Day]int64{}
	for _, tb := range tables {
		out[tb.Day] = tb.Readings
	}
	return out
}

// keysUnder counts the keys under prefix in the table of day.
func keysUnder(t *testing.T, ts *testStore, day buckets.Day, prefix string) int {
	t.Helper()
	tb, err := ts.acquire(context.Background(), day, forRead)
	require.NoError(t, err)
	require.NotNil(t, tb)
	defer ts.release(tb)
	txn, done := tb.ver.ReadTxn(tb.db)
	defer done()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix)})
	defer it.Close()
	n := 0
	for it.Rewind(); it.Valid(); it.Next() {
		n++
	}
	return n
}

// TestDeleteDevice deletes a device with readings on three days (in
// overlapping open blocks and sealed ones) and attributes, and checks
// that its readings, latest values, record and attributes are gone, the
// table counts lowered by exactly its readings, the tombstone kept, and
// another device's answers unchanged, also after a restart and a full
// compaction.
func TestDeleteDevice(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	days := []buckets.Day{buckets.DayOfTime(baseTime) - 2, buckets.DayOfTime(baseTime) - 1, buckets.DayOfTime(baseTime)}
	goneN := 0
	for i, d := range days {
		for _, dev := range []string{"gone", "kept"} {
			rs := series(dev, dayTick(d, time.Hour), time.Second, 5000) // sealed blocks after compaction
			ts.write(t, rs...)
			// Small commits leave open blocks; a repeat overlaps them.
			for j := range 20 {
				ts.write(t, reading(dev, dayTick(d, 3*time.Hour+time.Duration(j)*time.Second), "v", i*100+j))
			}
			if i < 2 { // on the newest day the compactor's notes list the open blocks with their values
				ts.write(t, reading(dev, dayTick(d, 3*time.Hour), "w", 1))
			}
			if dev == "gone" {
				goneN += 5000 + 20
			}
		}
		if i == 1 {
			ts.compactAll(true)
		}
	}
	ts.assign(t, set("gone", at(0), "fleet", "East", "only", "gone"), set("kept", at(0), "fleet", "East"))

	keptBefore := viewDevice(t, ts, "kept")
	require.Len(t, keptBefore.readings, 3*5020)
	countsBefore := tableCounts(t, ts)

	del, err := ts.DeleteDevice(ctx, "gone")
	require.NoError(t, err)
	assert.Equal(t, buckets.DeviceID("gone"), del.Device)
	assert.EqualValues(t, goneN, del.Readings, "distinct readings removed")
	assert.Equal(t, 3, del.Tables)
	deletedAt, ok := ts.DeletedAt("gone")
	require.True(t, ok)
	assert.Equal(t, del.Deleted, deletedAt)

	check := func(ts *testStore, step string) {
		t.Helper()
		v := viewDevice(t, ts, "gone")
		assert.Zero(t, len(v.readings), "%s: readings", step)
		assert.Zero(t, len(v.latest), "%s: latest", step)
		assert.ErrorIs(t, v.infoErr, buckets.ErrNotFound, "%s: record", step)
		devs, _, err := ts.Devices(ctx, buckets.DeviceQuery{Limit: 10})
		require.NoError(t, err)
		assert.Equal(t, []buckets.DeviceID{"kept"}, ids(devs), "%s: device list", step)
		vals, err := ts.AttributeValues(ctx, "fleet", buckets.DeviceQuery{})
		require.NoError(t, err)
		assert.Equal(t, []string{"East"}, vals, step)
		names, err := ts.AttributeNames(ctx, buckets.DeviceQuery{})
		require.NoError(t, err)
		assert.Equal(t, []string{"fleet"}, names, "%s: the name only the deleted device had", step)
		devs, _, err = ts.Devices(ctx, buckets.DeviceQuery{Limit: 10,
			Match: matchers(t, `{fleet="East"}`)})
		require.NoError(t, err)
		assert.Equal(t, []buckets.DeviceID{"kept"}, ids(devs), "%s: matched by attribute", step)
		assert.Equal(t, keptBefore, viewDevice(t, ts, "kept"), "%s: the other device", step)
		counts := tableCounts(t, ts)
		for _, d := range days {
			assert.Equal(t, countsBefore[d]-5020, counts[d], "%s: reading count of %s", step, d)
			assert.Zero(t, keysUnder(t, ts, d, "gone/"), "%s: block keys left in %s", step, d)
			assert.NotZero(t, keysUnder(t, ts, d, "kept/"), "%s: the other device's blocks in %s", step, d)
		}
		require.NoError(t, ts.checkAttrIndex(), step)
		at, ok := ts.DeletedAt("gone")
		assert.True(t, ok, step)
		assert.True(t, at.Equal(deletedAt), step)
	}
	check(ts, "after the delete")
	ts.compactAll(true)
	check(ts, "after a full compaction")
	ts = ts.reopen(t)
	check(ts, "after a restart")

	_, err = ts.DeleteDevice(ctx, "gone")
	assert.ErrorIs(t, err, buckets.ErrNotFound, "deleted already")
	_, err = ts.DeleteDevice(ctx, "nosuch")
	assert.ErrorIs(t, err, buckets.ErrNotFound)
	_, err = ts.DeleteDevice(ctx, "bad/id")
	assert.ErrorIs(t, err, buckets.ErrInvalidReading)

	// The store writes what it is given after a delete (skipping
	// replayed messages is the writer's job, by DeletedAt).
	ts.write(t, reading("gone", dayTick(days[2], 5*time.Hour), "v", 7))
	v := viewDevice(t, ts, "gone")
	require.Len(t, v.readings, 1)
	require.NoError(t, v.infoErr)
	assert.Empty(t, v.info.Attributes, "the attributes do not come back")
	assert.Equal(t, dayTick(days[2], 5*time.Hour), v.info.FirstSeen)
}

// TestDeleteDeviceWithOnlyAttributes deletes a device that has
// attributes but no readings.
func TestDeleteDeviceWithOnlyAttributes(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ts.assign(t, set("a1", at(0), "fleet", "East"))
	del, err := ts.DeleteDevice(context.Background(), "a1")
	require.NoError(t, err)
	assert.Zero(t, del.Readings)
	assert.Zero(t, del.Tables)
	_, err = ts.Device(context.Background(), "a1")
	assert.ErrorIs(t, err, buckets.ErrNotFound)
	ts = ts.reopen(t)
	_, err = ts.Device(context.Background(), "a1")
	assert.ErrorIs(t, err, buckets.ErrNotFound)
	require.NoError(t, ts.checkAttrIndex())
}

// TestDeleteDeviceAt applies a delete made elsewhere: the tombstone is
// recorded at the given time, known device or not, and survives a
// restart.
func TestDeleteDeviceAt(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	when := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	_, err := ts.DeleteDeviceAt(ctx, "never-seen", when)
	require.ErrorIs(t, err, buckets.ErrNotFound)
	got, ok := ts.DeletedAt("never-seen")
	require.True(t, ok, "recorded for an unknown device too")
	assert.True(t, when.Equal(got))

	ts.write(t, reading("held", at(time.Minute), "v", 1))
	del, err := ts.DeleteDeviceAt(ctx, "held", when)
	require.NoError(t, err)
	assert.EqualValues(t, 1, del.Readings)
	assert.True(t, when.Equal(del.Deleted))

	_, err = ts.DeleteDeviceAt(ctx, "held", time.Time{})
	assert.Error(t, err, "a delete time is required")
	ts = ts.reopen(t)
	got, ok = ts.DeletedAt("held")
	require.True(t, ok)
	assert.True(t, when.Equal(got))
	_, err = ts.Device(ctx, "held")
	assert.ErrorIs(t, err, buckets.ErrNotFound)
}

// TestDeleteDeviceWhileWriting deletes a device while writers that
// check the tombstones, as the ingester does, write it and another
// device, and the compactor runs: every reading of the deleted device
// stamped before the delete is gone, every one stamped after it is
// stored, and the other device keeps all of its. Run it with -race.
func TestDeleteDeviceWhileWriting(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t, func(o *Options) { o.CompactInterval = time.Millisecond })
	ctx := context.Background()
	type written struct {
		k   buckets.Ticks
		pub time.Time
	}
	var after []written // readings of "gone" written with a stamp after the delete
	deletedSeen := make(chan struct{})
	stop := make(chan struct{})
	done := make(chan struct{})
	var keptN atomic.Int64
	go func() {
		defer close(done)
		seen := false
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := at(time.Duration(i) * time.Second)
			pub := time.Now()
			release := ts.HoldDrops()
			rs := []buckets.Reading{reading("kept", k, "v", i)}
			if del, ok := ts.DeletedAt("gone"); !ok || !del.After(pub) {
				rs = append(rs, reading("gone", k, "v", i))
				if ok {
					after = append(after, written{k: k, pub: pub})
				}
			}
			if _, ok := ts.DeletedAt("gone"); ok && !seen {
				seen = true
				close(deletedSeen)
			}
			slices.SortFunc(rs, func(a, b buckets.Reading) int { return strings.Compare(string(a.Device), string(b.Device)) })
			err := ts.Write(ctx, rs)
			release()
			if !assert.NoError(t, err) {
				return
			}
			keptN.Add(1)
		}
	}()
	require.Eventually(t, func() bool {
		rs, err := ts.Latest(ctx, "gone", 1)
		return err == nil && len(rs) == 1 && rs[0].Ticks > at(300*time.Second)
	}, time.Minute, time.Millisecond, "the writer wrote for a while")
	_, err := ts.DeleteDevice(ctx, "gone")
	require.NoError(t, err)
	<-deletedSeen
	n := keptN.Load()
	require.Eventually(t, func() bool { return keptN.Load() > n+300 }, time.Minute, time.Millisecond, "the writer went on")
	close(stop)
	<-done
	ts.compactAll(true)

	page, err := ts.Range(ctx, buckets.RangeQuery{Device: "gone", From: 0, To: buckets.MaxTicks, Order: buckets.Asc, Limit: 1 << 20})
	require.NoError(t, err)
	require.NotEmpty(t, after, "the test needs readings written after the delete")
	want := make([]buckets.Ticks, len(after))
	for i, w := range after {
		want[i] = w.k
	}
	assert.Equal(t, want, ticksOf(page.Readings), "exactly the readings stamped after the delete")
	page, err = ts.Range(ctx, buckets.RangeQuery{Device: "kept", From: 0, To: buckets.MaxTicks, Order: buckets.Asc, Limit: 1 << 20})
	require.NoError(t, err)
	assert.Len(t, page.Readings, int(keptN.Load()), "the other device")
}
