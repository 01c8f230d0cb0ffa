package store

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/badgeropts"
	"github.com/telemetryd/telemetryd/store/block"
	"github.com/telemetryd/telemetryd/store/versions"
)

// editTable opens the Badger database of the day table in dir (the
// store closed) and calls edit with every block key, value and user
// meta byte; the values and meta bytes edit returns replace the stored
// ones, written as a new version, as damage or an older build would
// have left them.
func editTable(t *testing.T, dir string, edit func(key, value []byte, meta byte) ([]byte, byte)) {
	t.Helper()
	db, err := badgeropts.OpenManaged(badgeropts.For(dir, badgeropts.Cold, true, false, slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	type change struct {
		value []byte
		meta  byte
	}
	changed := map[string]change{}
	require.NoError(t, versions.ViewLatest(db, func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if _, _, ok := parseAnyBlockKey(it.Item().Key()); !ok {
				continue
			}
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			meta := it.Item().UserMeta()
			if nv, nm := edit(it.Item().KeyCopy(nil), bytes.Clone(v), meta); !bytes.Equal(nv, v) || nm != meta {
				changed[string(it.Item().Key())] = change{nv, nm}
			}
		}
		return nil
	}))
	require.NotEmpty(t, changed, "edit changed no block")
	txn := db.NewTransactionAt(db.MaxVersion(), true)
	defer txn.Discard()
	for k, c := range changed {
		require.NoError(t, txn.SetEntry(badger.NewEntry([]byte(k), c.value).WithMeta(c.meta)))
	}
	require.NoError(t, txn.CommitAt(db.MaxVersion()+1, nil))
}

// corruptCount is the value of telemetry.store.corrupt_blocks of kind.
func corruptCount(t *testing.T, m map[string]metricdata.Aggregation, kind string) int64 {
	t.Helper()
	sum, ok := m["telemetry.store.corrupt_blocks"].(metricdata.Sum[int64])
	require.True(t, ok, "the counter is exported from the start")
	for _, dp := range sum.DataPoints {
		if v, _ := dp.Attributes.Value("kind"); v.AsString() == kind {
			return dp.Value
		}
	}
	t.Fatalf("no data point of kind %s", kind)
	return 0
}

// countOf sums the counts of name over the buckets of p.
func countOf(p buckets.AggregatePage, name string) (n int64, sum float64) {
	for _, b := range p.Buckets {
		for _, v := range b.Values {
			if v.Name == name {
				n += v.Summary.Count
				sum += v.Summary.Sum
			}
		}
	}
	return n, sum
}

// TestCorruptBlockIsSkippedWithAWarningAndCounted flips one bit of one
// stored block, directly in Badger, and reads the device every way the
// store reads blocks: each answer holds the other blocks' readings and
// a warning naming the corrupt block, the metric counts the block once,
// and writes go on.
func TestCorruptBlockIsSkippedWithAWarningAndCounted(t *testing.T) {
	t.Parallel()
	testCorruptBlockIsSkipped(t, func(v []byte) { v[len(v)/2] ^= 0x10 }, "checksum mismatch")
}

// testCorruptBlockIsSkipped is the test of one corruption: damage
// changes the middle block's value in place, and the warning names it
// and contains reason.
//
// Long: one scenario read every way the store reads blocks.
func testCorruptBlockIsSkipped(t *testing.T, damage func([]byte), reason string) {
	reader := sdkmetric.NewManualReader()
	ts := newTestStore(t, func(o *Options) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		o.CompactInterval = time.Hour // the blocks stay as written
	})
	const dev = "dev-1"
	var want []buckets.Ticks
	for w := range 3 { // one block per hour (a sealed block covers at most one)
		var rs []buckets.Reading
		for i := range 10 {
			k := at(time.Duration(w)*time.Hour + time.Duration(i)*time.Second)
			rs = append(rs, reading(dev, k, "n", w*10+i))
			if w != 1 {
				want = append(want, k)
			}
		}
		ts.write(t, rs...)
	}
	day := buckets.DayOf(at(0))
	require.NoError(t, ts.Close())
	var badKey []byte
	editTable(t, ts.tableDir(day), func(key, v []byte, meta byte) ([]byte, byte) {
		_, ref, _ := parseAnyBlockKey(key)
		if ref.oldest != at(time.Hour) {
			return v, meta
		}
		badKey = key
		damage(v)
		return v, meta
	})
	ts = ts.reopen(t)
	keyHex := hex.EncodeToString(badKey)
	checkWarned := func(t *testing.T, w *buckets.Warnings) {
		t.Helper()
		list := w.List()
		require.Len(t, list, 1)
		assert.Contains(t, list[0], day.String())
		assert.Contains(t, list[0], dev)
		assert.Contains(t, list[0], keyHex)
		assert.Contains(t, list[0], reason)
	}

	t.Run("latest", func(t *testing.T) {
		ctx, w := buckets.WithWarnings(context.Background())
		rs, err := ts.Latest(ctx, dev, 100)
		require.NoError(t, err)
		got := ticksOf(rs)
		slices.Reverse(got)
		assert.Equal(t, want, got)
		checkWarned(t, w)
	})
	for _, order := range []buckets.Order{buckets.Asc, buckets.Desc} {
		t.Run(fmt.Sprintf("range %v", order), func(t *testing.T) {
			ctx, w := buckets.WithWarnings(context.Background())
			p, err := ts.Range(ctx, buckets.RangeQuery{Device: dev, From: day.Start(), To: day.End(), Order: order, Limit: 100})
			require.NoError(t, err)
			got := ticksOf(p.Readings)
			if order == buckets.Desc {
				slices.Reverse(got)
			}
			assert.Equal(t, want, got)
			checkWarned(t, w)
		})
	}
	t.Run("get", func(t *testing.T) {
		ctx, w := buckets.WithWarnings(context.Background())
		_, err := ts.Get(ctx, dev, at(time.Hour+5*time.Second))
		require.ErrorIs(t, err, buckets.ErrNotFound)
		checkWarned(t, w)
		r, err := ts.Get(context.Background(), dev, at(2*time.Hour+5*time.Second))
		require.NoError(t, err)
		assert.Equal(t, buckets.Int(25), r.Values[0].Value)
	})
	// Each block in one bucket (headers), buckets cutting blocks
	// (columns).
	for _, interval := range []time.Duration{time.Hour, 5 * time.Second} {
		t.Run(fmt.Sprintf("aggregate %v", interval), func(t *testing.T) {
			ctx, w := buckets.WithWarnings(context.Background())
			p, err := ts.Aggregate(ctx, buckets.AggregateQuery{Device: dev, From: day.Start(), To: day.End(),
				Interval: buckets.Ticks(interval / 100), Limit: 1000})
			require.NoError(t, err)
			n, sum := countOf(p, "n")
			assert.Equal(t, int64(20), n)
			assert.Equal(t, float64(45+245), sum) // 0..9 and 20..29
			checkWarned(t, w)
		})
	}
	t.Run("write over the corrupt block, then aggregate overlapping blocks", func(t *testing.T) {
		ts.write(t, reading(dev, at(time.Hour+5*time.Second), "m", 7))
		ctx, w := buckets.WithWarnings(context.Background())
		p, err := ts.Aggregate(ctx, buckets.AggregateQuery{Device: dev, From: day.Start(), To: day.End(),
			Interval: buckets.Ticks(time.Hour / 100), Limit: 10})
		require.NoError(t, err)
		n, _ := countOf(p, "n")
		m, _ := countOf(p, "m")
		assert.Equal(t, int64(20), n)
		assert.Equal(t, int64(1), m)
		checkWarned(t, w)
		r, err := ts.Get(context.Background(), dev, at(time.Hour+5*time.Second))
		require.NoError(t, err)
		assert.Equal(t, []buckets.Field{{Name: "m", Value: buckets.Int(7)}}, r.Values)
	})
	m := collectMetrics(t, reader)
	assert.Equal(t, int64(1), corruptCount(t, m, "block"), "counted once, however often it was read")

	bad, err := ts.Check(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, bad.Blocks, 1)
	assert.Equal(t, day, bad.Blocks[0].Day)
	assert.Equal(t, buckets.DeviceID(dev), bad.Blocks[0].Device)
	assert.Equal(t, badKey, bad.Blocks[0].Key)
	require.ErrorIs(t, bad.Blocks[0].Err, block.ErrCorrupt)
	assert.Contains(t, bad.Blocks[0].Err.Error(), reason)
}

// TestCorruptDeviceIndexRecordIsRebuilt flips one bit of a device's
// record in the device index: the store still opens, counts it and
// rebuilds the record from the day tables.
func TestCorruptDeviceIndexRecordIsRebuilt(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ts.write(t, series("dev-1", at(0), time.Second, 10)...)
	ts.write(t, series("dev-2", at(0), time.Second, 10)...)
	require.NoError(t, ts.Close())

	db, err := badgeropts.Open(badgeropts.For(filepath.Join(ts.dir, indexDirName), badgeropts.Index, true, false, slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)
	require.NoError(t, db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte("dev-1"))
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		v[len(v)/2] ^= 1
		return txn.Set([]byte("dev-1"), v)
	}))
	require.NoError(t, db.Close())

	reader := sdkmetric.NewManualReader()
	ts = ts.reopen(t, func(o *Options) { o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) })
	rs, err := ts.Latest(context.Background(), "dev-1", 100)
	require.NoError(t, err)
	assert.Len(t, rs, 10)
	assert.Equal(t, int64(1), corruptCount(t, collectMetrics(t, reader), "device_index_record"))
	bad, err := ts.Check(context.Background(), nil)
	require.NoError(t, err)
	assert.Empty(t, bad.Records, "the rebuild rewrote the record")
}
