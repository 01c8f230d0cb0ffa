package store

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func TestWriteReadRoundTripAllKinds(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	k := at(-time.Hour) + 1234567 // sub-millisecond ticks survive
	r := reading("dev-1", k,
		"f", 21.5, "fint", 42.0, "fneg0", math.Copysign(0, -1), "fbig", 1e300, "ftiny", -5e-324,
		"i", math.MinInt64, "imax", int64(math.MaxInt64), "i0", 0,
		"yes", true, "no", false,
		"s", "héllo, wörld ✓", "empty", "", "long", strings.Repeat("x", buckets.MaxStringLen))
	ts.write(t, r)

	got, err := ts.Get(ctx, "dev-1", k)
	require.NoError(t, err)
	assert.Equal(t, r, got)
	assert.True(t, math.Signbit(mustValue(t, got, "fneg0").AsFloat()), "negative zero keeps its sign")
	assert.Equal(t, buckets.KindFloat, mustValue(t, got, "fint").Kind, "a whole float stays a float")

	latest, err := ts.Latest(ctx, "dev-1", 10)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Reading{r}, latest)

	page, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev-1", From: k, To: k + 1, Limit: 10})
	require.NoError(t, err)
	assert.Equal(t, buckets.Page{Readings: []buckets.Reading{r}}, page)
}

func mustValue(t *testing.T, r buckets.Reading, name string) buckets.Value {
	t.Helper()
	v, ok := r.Get(name)
	require.True(t, ok, "value %q", name)
	return v
}

func TestWriteMergesSameKey(t *testing.T) {
	t.Parallel()
	k := at(-time.Minute)
	tests := []struct {
		name   string
		count  int64 // distinct readings in the table
		writes [][]buckets.Reading
	}{
		{"across two writes", 1, [][]buckets.Reading{
			{reading("dev", k, "temp", 20.0, "hum", 40)},
			{reading("dev", k, "temp", 21.5, "ok", true)},
		}},
		{"inside one write", 2, [][]buckets.Reading{
			{reading("dev", k, "temp", 20.0, "hum", 40), reading("other", k, "x", 1), reading("dev", k, "temp", 21.5, "ok", true)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := newTestStore(t)
			for _, w := range tt.writes {
				ts.write(t, w...)
			}
			got, err := ts.Get(context.Background(), "dev", k)
			require.NoError(t, err)
			assert.Equal(t, reading("dev", k, "hum", 40, "ok", true, "temp", 21.5), got, "new value wins per name, nothing lost")
			tables, err := ts.Tables(context.Background())
			require.NoError(t, err)
			require.Len(t, tables, 1)
			assert.Equal(t, tt.count, tables[0].Readings, "a merge does not count twice")
		})
	}
}

func TestWriteMergeOrderInsideOneWrite(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	k := at(0)
	ts.write(t, reading("dev", k, "v", 1), reading("dev", k, "v", 2), reading("dev", k, "v", 3))
	got, err := ts.Get(context.Background(), "dev", k)
	require.NoError(t, err)
	assert.Equal(t, reading("dev", k, "v", 3), got, "the last reading in slice order wins")
}

func TestWriteIdempotentRedelivery(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	msg := []buckets.Reading{
		reading("dev", at(-2*time.Second), "a", 1.5, "b", "x"),
		reading("dev", at(-time.Second), "a", 2.5),
	}
	ts.write(t, msg...)
	before := rawTable(t, ts, today)

	ts.write(t, msg...)
	assert.Equal(t, before, rawTable(t, ts, today), "a redelivery leaves the same bytes and versions")

	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	require.Len(t, tables, 1)
	assert.Equal(t, int64(2), tables[0].Readings)
}

// rawItem is a stored key with its value bytes and version.
type rawItem struct {
	key, value string
	version    uint64
}

// rawTable returns every key of the table of day as stored.
func rawTable(t *testing.T, ts *testStore, day buckets.Day) []rawItem {
	t.Helper()
	h, err := ts.acquire(context.Background(), day, forRead)
	require.NoError(t, err)
	require.NotNil(t, h)
	defer ts.release(h)
	var out []rawItem
	txn, done := h.ver.ReadTxn(h.db)
	defer done()
	require.NoError(t, func() error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out = append(out, rawItem{string(it.Item().Key()), string(v), it.Item().Version()})
		}
		return nil
	}())
	return out
}

func TestWriteSplitsTooBigTransactions(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	old := today - 5 // a cold table: small memtable, small transactions
	n := 6000
	if testing.Short() {
		n = 4000
	}
	rs := series("dev", dayTick(old, time.Hour), time.Second, n)
	for i := range rs {
		rs[i].Values = append(rs[i].Values, buckets.Field{Name: "s", Value: buckets.String(strings.Repeat("y", 40))})
	}
	h, err := ts.acquire(ctx, old, forWrite)
	require.NoError(t, err)
	require.False(t, h.hot)
	require.Less(t, h.db.MaxBatchCount(), int64(n), "the batch must not fit one transaction")
	ts.release(h)

	ts.write(t, rs...)
	page, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: old.Start(), To: old.End(), Order: buckets.Asc, Limit: n})
	require.NoError(t, err)
	assert.Equal(t, rs, page.Readings)
	assert.False(t, page.More)
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, []int64{int64(n)}, []int64{tables[0].Readings})
}

func TestWriteRejectsInvalidReadings(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	good := reading("dev", at(0), "v", 1)
	tests := []struct {
		name string
		r    buckets.Reading
	}{
		{"slash in device", reading("a/b", at(0), "v", 1)},
		{"no values", buckets.Reading{Device: "dev", Ticks: at(1)}},
		{"unsorted names", buckets.Reading{Device: "dev", Ticks: at(2), Values: []buckets.Field{
			{Name: "b", Value: buckets.Int(1)}, {Name: "a", Value: buckets.Int(2)}}}},
		{"NaN", reading("dev", at(3), "v", math.NaN())},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ts.Write(ctx, []buckets.Reading{good, tt.r})
			require.ErrorIs(t, err, buckets.ErrInvalidReading)
			_, err = ts.Get(ctx, "dev", good.Ticks)
			assert.ErrorIs(t, err, buckets.ErrNotFound, "nothing of the batch is written")
		})
	}
}

func TestWriteEmptyIsNoop(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	require.NoError(t, ts.Write(context.Background(), nil))
	tables, err := ts.Tables(context.Background())
	require.NoError(t, err)
	assert.Empty(t, tables)
}

func TestWriteAfterCloseIsUnavailable(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	require.NoError(t, ts.Close())
	err := ts.Write(context.Background(), []buckets.Reading{reading("dev", at(0), "v", 1)})
	assert.ErrorIs(t, err, buckets.ErrUnavailable)
	assert.ErrorIs(t, ts.Ping(context.Background()), buckets.ErrUnavailable)
	assert.NoError(t, ts.Close(), "Close is idempotent")
}

func TestWriteMergesWithOlderAndReopenedReadings(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	k1, k2 := at(-time.Hour), at(-time.Minute)
	ts.write(t, reading("dev", k1, "a", 1), reading("dev", k2, "a", 2))

	// Older than the newest reading of the table: must be merged.
	ts.write(t, reading("dev", k1, "b", true))
	// After a restart the table must still know what it holds.
	ts = ts.reopen(t)
	ts.write(t, reading("dev", k2, "b", false))
	// A table without the newest-ticks key (as if written before it
	// existed) reads before every write.
	h, err := ts.acquire(ctx, today, forWrite)
	require.NoError(t, err)
	h.writeMu.Lock()
	txn := h.ver.WriteTxn(h.db)
	require.NoError(t, txn.Delete(metaNewestKey))
	require.NoError(t, h.commitTxn(txn))
	h.writeMu.Unlock()
	ts.release(h)
	ts = ts.reopen(t)
	ts.write(t, reading("dev", k2, "c", "x"))

	got, err := ts.Latest(ctx, "dev", 10)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Reading{
		reading("dev", k2, "a", 2, "b", false, "c", "x"),
		reading("dev", k1, "a", 1, "b", true),
	}, got)
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), tables[0].Readings)
}

// Devices report the same instants, so most readings of a write are
// older than the newest reading of the table; they are read before
// writing only when their own device may already hold them. Merges must
// keep working either way.
func TestWriteMergesWhenDevicesShareInstants(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	k := at(-time.Hour)
	sec := buckets.Ticks(buckets.TicksPerSecond)
	ts.write(t, reading("a", k, "v", 1), reading("a", k+sec, "v", 2), reading("a", k+2*sec, "v", 3))
	ts.write(t, reading("b", k, "v", 10), reading("b", k+sec, "v", 11)) // older than the table's newest, new for b
	ts.write(t, reading("b", k+sec, "w", true), reading("a", k, "w", false))
	ts = ts.reopen(t) // everything is now at or before the table's newest when opened
	ts.write(t, reading("b", k, "x", "y"))

	for dev, want := range map[buckets.DeviceID][]buckets.Reading{
		"a": {reading("a", k+2*sec, "v", 3), reading("a", k+sec, "v", 2), reading("a", k, "v", 1, "w", false)},
		"b": {reading("b", k+sec, "v", 11, "w", true), reading("b", k, "v", 10, "x", "y")},
	} {
		got, err := ts.Latest(ctx, dev, 10)
		require.NoError(t, err)
		assert.Equal(t, want, got, "device %s", dev)
	}
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(5), tables[0].Readings)
}

// The per-device record of what a table wrote is bounded: at the bound
// it is kept, one device past it the table falls back to its newest
// reading for every device, and merges still work.
func TestWriteBoundsDevicesTracked(t *testing.T) { // not parallel: sets maxWrittenDevices
	old := maxWrittenDevices
	maxWrittenDevices = 2
	t.Cleanup(func() { maxWrittenDevices = old })
	ts := newTestStore(t)
	ctx := context.Background()
	k := at(-time.Hour)
	tracked := func() (int, buckets.Ticks) {
		h, err := ts.acquire(ctx, today, forWrite)
		require.NoError(t, err)
		defer ts.release(h)
		h.writeMu.Lock()
		defer h.writeMu.Unlock()
		w := h.tracker()
		return len(w.written), w.floor
	}

	ts.write(t, reading("a", k+3, "v", 1), reading("b", k+2, "v", 2))
	n, floor := tracked()
	assert.Equal(t, 2, n, "at the bound every device is tracked")
	assert.Equal(t, buckets.Ticks(-1), floor, "a new table holds nothing")

	ts.write(t, reading("c", k+1, "v", 3))
	n, floor = tracked()
	assert.Equal(t, 0, n, "one past the bound the record is dropped")
	assert.Equal(t, k+3, floor, "and the table's newest reading bounds every device")

	ts.write(t, reading("c", k+1, "w", 4), reading("b", k+2, "w", 5), reading("d", k+4, "v", 6))
	for dev, want := range map[buckets.DeviceID]buckets.Reading{
		"b": reading("b", k+2, "v", 2, "w", 5),
		"c": reading("c", k+1, "v", 3, "w", 4),
		"d": reading("d", k+4, "v", 6),
	} {
		got, err := ts.Get(ctx, dev, want.Ticks)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(4), tables[0].Readings)
}
