package store

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/badgeropts"
	"github.com/telemetryd/telemetryd/store/devindex"
)

// editIndexDB changes the closed store's index database directly.
func editIndexDB(t *testing.T, ts *testStore, fn func(txn *badger.Txn) error) {
	t.Helper()
	db, err := badgeropts.Open(badgeropts.For(filepath.Join(ts.dir, indexDirName), badgeropts.Index, true, false, slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)
	require.NoError(t, db.Update(fn))
	require.NoError(t, db.Close())
}

// fleetOf lists the devices of {fleet=fleet}.
func (ts *testStore) fleetOf(t *testing.T, fleet string) []buckets.DeviceID {
	t.Helper()
	devs, _, err := ts.Devices(context.Background(), buckets.DeviceQuery{Limit: 100, Match: matchers(t, `{fleet="`+fleet+`"}`)})
	require.NoError(t, err)
	return ids(devs)
}
func TestCheckComparesEntitiesWithRecordsAndOpenRepairs(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ts.assign(t, set("d1", at(0), "fleet", "East"), set("d2", at(0), "fleet", "East", "model", "F"))
	rep, err := ts.Check(context.Background(), nil)
	require.NoError(t, err)
	assert.True(t, rep.Clean())
	assert.Equal(t, 2, rep.AttributeRecordsRead)
	assert.Equal(t, 3, rep.EntitiesRead)
	require.NoError(t, ts.Close())

	editIndexDB(t, ts, func(txn *badger.Txn) error {
		if err := txn.Delete(devindex.EntityKey("fleet", "East", "d1")); err != nil {
			return err
		}
		return txn.Set(devindex.EntityKey("fleet", "West", "d9"), nil)
	})

	ro := openTestStore(t, ts.dir, ts.clock, func(o *Options) { *o = ts.opts; o.ReadOnly = true })
	rep, err = ro.Check(context.Background(), nil)
	require.NoError(t, err)
	assert.False(t, rep.Clean())
	assert.Equal(t, 1, rep.MissingEntities)
	assert.Equal(t, 1, rep.StrayEntities)
	assert.Equal(t, []buckets.DeviceID{"d1", "d2"}, ro.fleetOf(t, "East"), "queries answer from the records")
	require.NoError(t, ro.Close())

	ts = openTestStore(t, ts.dir, ts.clock, func(o *Options) { *o = ts.opts })
	rep, err = ts.Check(context.Background(), nil)
	require.NoError(t, err)
	assert.True(t, rep.Clean(), "a writable open rewrote the entities: %+v", rep)
	assert.Equal(t, 3, rep.EntitiesRead)
	assert.Equal(t, []buckets.DeviceID{"d1", "d2"}, ts.fleetOf(t, "East"))
	assert.Empty(t, ts.fleetOf(t, "West"))
}
func TestCorruptAttributeRecordIsRebuiltFromEntities(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ts.assign(t, set("d1", at(time.Hour), "fleet", "East", "model", "F"), set("d2", at(0), "fleet", "West"))
	require.NoError(t, ts.Close())
	editIndexDB(t, ts, func(txn *badger.Txn) error {
		item, err := txn.Get(devindex.AttrRecordKey("d1"))
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		v[len(v)/2] ^= 1
		return txn.Set(devindex.AttrRecordKey("d1"), v)
	})

	ro := openTestStore(t, ts.dir, ts.clock, func(o *Options) { *o = ts.opts; o.ReadOnly = true })
	rep, err := ro.Check(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, rep.Records, 1)
	assert.Equal(t, buckets.DeviceID("d1"), rep.Records[0].Device)
	assert.ErrorContains(t, rep.Records[0].Err, "attribute record")
	assert.Zero(t, rep.StrayEntities, "the entities of a corrupt record are not counted twice")
	require.NoError(t, ro.Close())

	reader := sdkmetric.NewManualReader()
	ts = openTestStore(t, ts.dir, ts.clock, func(o *Options) {
		*o = ts.opts
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	assert.Equal(t, int64(1), corruptCount(t, collectMetrics(t, reader), "device_index_record"))
	assert.Equal(t, map[string]string{"fleet": "East", "model": "F"}, ts.attrsOf(t, "d1"), "values rebuilt from the entities")
	assert.Equal(t, map[string]string{"fleet": "West"}, ts.attrsOf(t, "d2"))
	rep, err = ts.Check(context.Background(), nil)
	require.NoError(t, err)
	assert.True(t, rep.Clean(), "%+v", rep)
	// The assignment times are lost: any later assignment wins.
	ts.assign(t, set("d1", at(0), "fleet", "North"))
	assert.Equal(t, []buckets.DeviceID{"d1"}, ts.fleetOf(t, "North"))
}
