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
)

// editIndexDB changes the closed store's index database directly.
func editIndexDB(t *testing.T, ts *testStore, fn func(txn *badger.Txn) error) {
	t.Helper()
	db, err := openBadger(badgerOptions(filepath.Join(ts.dir, indexDirName), classIndex, true, false, slog.New(slog.NewTextHandler(io.Discard, nil))))
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
	ts := newTestStore(t)
	ts.assign(t, set("d1", at(0), "fleet", "East"), set("d2", at(0), "fleet", "East", "model", "F"))
	rep, err := ts.Check(context.Background(), nil)
	require.NoError(t, err)
	assert.True(t, rep.Clean())
	assert.Equal(t, 2, rep.AttributeRecordsRead)
	assert.Equal(t, 3, rep.EntitiesRead)
	require.NoError(t, ts.Close())

	editIndexDB(t, ts, func(txn *badger.Txn) error {
		if err := txn.Delete(entityKey("fleet", "East", "d1")); err != nil {
			return err
		}
		return txn.Set(entityKey("fleet", "West", "d9"), nil)
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
	ts := newTestStore(t)
	ts.assign(t, set("d1", at(time.Hour), "fleet", "East", "model", "F"), set("d2", at(0), "fleet", "West"))
	require.NoError(t, ts.Close())
	editIndexDB(t, ts, func(txn *badger.Txn) error {
		item, err := txn.Get(attrRecordKey("d1"))
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		v[len(v)/2] ^= 1
		return txn.Set(attrRecordKey("d1"), v)
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

func TestAttrRecordDecodeRefusesDamage(t *testing.T) {
	r := &attrRecord{floor: 5, set: attrs("fleet", "East", "model", "F"), at: []buckets.Ticks{7, 9},
		gone: []tombstone{{name: "color", at: 8}}}
	b := encodeAttrRecord(nil, r)
	got, err := decodeAttrRecord(b)
	require.NoError(t, err)
	assert.Equal(t, r, got)
	for i := range b {
		for bit := range 8 {
			c := append([]byte(nil), b...)
			c[i] ^= 1 << bit
			_, err := decodeAttrRecord(c)
			require.Error(t, err, "byte %d bit %d", i, bit)
		}
	}
	for n := range len(b) {
		_, err := decodeAttrRecord(b[:n])
		require.Error(t, err, "truncated to %d bytes", n)
	}
}

func TestEntityKeyRoundTrip(t *testing.T) {
	for _, v := range []string{"East", "a\x00b", "\x00", "x\x00\x00"} {
		name, value, dev, ok := parseEntityKey(entityKey("fleet", v, "dev-1"))
		require.True(t, ok)
		assert.Equal(t, "fleet", name)
		assert.Equal(t, v, value)
		assert.Equal(t, buckets.DeviceID("dev-1"), dev)
	}
	_, _, _, ok := parseEntityKey([]byte{attrEntityPrefix, 'a'})
	assert.False(t, ok)
}
