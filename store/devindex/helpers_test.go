package devindex

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// baseTime is "now" in tests: noon, so a few hours either way stay in
// the same day.
var baseTime = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// at is the tick of baseTime moved by d.
func at(d time.Duration) buckets.Ticks { return buckets.MustTicks(baseTime.Add(d)) }

// testIndex is an Index on a Badger database in a temp dir.
type testIndex struct {
	*Index
	dir    string
	closed bool
}

// indexOptions are Badger options sized as the store sizes the index
// database.
func indexOptions(dir string, readOnly bool) badger.Options {
	const memTable = 4 << 20
	return badger.DefaultOptions(dir).WithLogger(nil).WithReadOnly(readOnly).
		WithNumVersionsToKeep(1).WithMemTableSize(memTable).WithValueThreshold(memTable / 8)
}

// newTestIndex opens an index in a fresh temp dir.
func newTestIndex(t testing.TB) *testIndex {
	t.Helper()
	return openTestIndex(t, t.TempDir(), false)
}

// openTestIndex opens the index in dir and closes it at the end of the
// test.
func openTestIndex(t testing.TB, dir string, readOnly bool) *testIndex {
	t.Helper()
	db, err := badger.Open(indexOptions(dir, readOnly))
	require.NoError(t, err)
	x, err := Load(db, readOnly, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		_ = db.Close()
	}
	require.NoError(t, err)
	ti := &testIndex{Index: x, dir: dir}
	t.Cleanup(func() { _ = ti.Close() })
	return ti
}

// Close persists pending updates and closes the database, as the store
// does; a second Close does nothing.
func (ti *testIndex) Close() error {
	if ti.closed {
		return nil
	}
	ti.closed = true
	return errors.Join(ti.Flush(), ti.DB().Close())
}

// reopen closes ti and loads the index again from its directory.
func (ti *testIndex) reopen(t testing.TB) *testIndex {
	t.Helper()
	require.NoError(t, ti.Close())
	return openTestIndex(t, ti.dir, false)
}

// write records committed readings as the store does after a commit.
func (ti *testIndex) write(t testing.TB, rs ...buckets.Reading) {
	t.Helper()
	require.NoError(t, ti.Persist(ti.Observe(rs)))
}

// reading builds a reading with values in name order.
func reading(dev string, k buckets.Ticks, kv ...any) buckets.Reading {
	r := buckets.Reading{Device: buckets.DeviceID(dev), Ticks: k}
	for i := 0; i < len(kv); i += 2 {
		var v buckets.Value
		switch x := kv[i+1].(type) {
		case float64:
			v = buckets.Float(x)
		case int:
			v = buckets.Int(int64(x))
		default:
			panic(fmt.Sprintf("unsupported value %T", x))
		}
		r.Values = append(r.Values, buckets.Field{Name: kv[i].(string), Value: v})
	}
	if _, ok := buckets.SortValues(r.Values); !ok {
		panic("duplicate value name")
	}
	return r
}

// attrs builds a sorted attribute set from name, value pairs.
func attrs(kv ...string) buckets.Attributes {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	a, err := buckets.NewAttributes(m)
	if err != nil {
		panic(err)
	}
	return a
}

// assign applies as and fails the test on error.
func (ti *testIndex) assign(t testing.TB, as ...buckets.Assignment) {
	t.Helper()
	require.NoError(t, ti.Assign(as))
}

// attrsOf returns dev's attributes as a map (empty when it has none).
func (ti *testIndex) attrsOf(t testing.TB, dev string) map[string]string {
	t.Helper()
	di, err := ti.Device(buckets.DeviceID(dev))
	require.NoError(t, err)
	return di.Attributes.Map()
}

// checkAttrIndex runs Check and returns an error when the attribute
// index disagrees with the records.
func (ti *testIndex) checkAttrIndex() error {
	res, err := ti.Check()
	if err != nil {
		return err
	}
	if len(res.Bad) > 0 || res.MissingEntities != 0 || res.StrayEntities != 0 {
		return fmt.Errorf("check: %+v", res)
	}
	return nil
}

func set(dev string, at buckets.Ticks, kv ...string) buckets.Assignment {
	return buckets.Assignment{Device: buckets.DeviceID(dev), At: at, Set: attrs(kv...)}
}

func put(dev string, at buckets.Ticks, kv ...string) buckets.Assignment {
	a := set(dev, at, kv...)
	a.Replace = true
	return a
}

func remove(dev string, at buckets.Ticks, names ...string) buckets.Assignment {
	return buckets.Assignment{Device: buckets.DeviceID(dev), At: at, Remove: names}
}

// matchers parses a selector such as {fleet="East"}.
func matchers(t testing.TB, sel string) []*buckets.Matcher {
	t.Helper()
	ms, err := parser.NewParser(parser.Options{}).ParseMetricSelector(sel)
	require.NoError(t, err)
	out := make([]*buckets.Matcher, len(ms))
	for i, m := range ms {
		out[i], err = buckets.NewMatcher(buckets.MatchType(m.Type), m.Name, m.Value)
		require.NoError(t, err)
	}
	return out
}

// ids lists the devices of ds.
func ids(ds []buckets.DeviceInfo) []buckets.DeviceID {
	out := []buckets.DeviceID{}
	for _, d := range ds {
		out = append(out, d.Device)
	}
	return out
}
