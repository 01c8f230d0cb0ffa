package store

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

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
func (ts *testStore) assign(t *testing.T, as ...buckets.Assignment) {
	t.Helper()
	require.NoError(t, ts.Assign(context.Background(), as))
}

// attrsOf returns dev's attributes as a map (empty when it has none).
func (ts *testStore) attrsOf(t *testing.T, dev string) map[string]string {
	t.Helper()
	di, err := ts.Device(context.Background(), buckets.DeviceID(dev))
	require.NoError(t, err)
	return di.Attributes.Map()
}
func set(dev string, at buckets.Ticks, kv ...string) buckets.Assignment {
	return buckets.Assignment{Device: buckets.DeviceID(dev), At: at, Set: attrs(kv...)}
}
func TestAssignDeviceWithoutReadingsSurvivesRestart(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ts.assign(t, set("parked", at(0), "fleet", "West"))
	ts = ts.reopen(t)
	devs, _, err := ts.Devices(context.Background(), buckets.DeviceQuery{Limit: 10})
	require.NoError(t, err)
	require.Len(t, devs, 1)
	assert.Equal(t, buckets.DeviceID("parked"), devs[0].Device)
	assert.Equal(t, attrs("fleet", "West"), devs[0].Attributes)
	assert.Zero(t, devs[0].LastSeen)

	ts.write(t, reading("parked", at(time.Hour), "v", 1))
	ts = ts.reopen(t)
	di, err := ts.Device(context.Background(), "parked")
	require.NoError(t, err)
	assert.Equal(t, at(time.Hour), di.FirstSeen, "the first reading's bounds were persisted")
	assert.Equal(t, at(time.Hour), di.LastSeen)
	rs, err := ts.Latest(context.Background(), "parked", 1)
	require.NoError(t, err)
	assert.Len(t, rs, 1, "queries find the day of the first reading")
}
func TestAttributesSurviveDroppingEveryDay(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	ts.write(t, reading("d", dayTick(today-2, time.Hour), "v", 1), reading("d", dayTick(today-1, time.Hour), "v", 2))
	ts.assign(t, set("d", dayTick(today-1, time.Hour), "fleet", "East"))
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, tables)
	for _, tb := range tables {
		_, err := ts.DropTable(ctx, tb.Day)
		require.NoError(t, err)
	}
	assert.Equal(t, map[string]string{"fleet": "East"}, ts.attrsOf(t, "d"))
	devs, _, err := ts.Devices(ctx, buckets.DeviceQuery{Limit: 10, Match: matchers(t, `{fleet="East"}`)})
	require.NoError(t, err)
	require.Len(t, devs, 1)
	ts = ts.reopen(t)
	assert.Equal(t, map[string]string{"fleet": "East"}, ts.attrsOf(t, "d"))
	devs, _, err = ts.Devices(ctx, buckets.DeviceQuery{Limit: 10, Match: matchers(t, `{fleet="East"}`)})
	require.NoError(t, err)
	require.Len(t, devs, 1)
}
func TestAssignOnReadOnlyStore(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ts.assign(t, set("d", at(0), "fleet", "East"))
	require.NoError(t, ts.Close())
	ro := openTestStore(t, ts.dir, ts.clock, func(o *Options) { *o = ts.opts; o.ReadOnly = true })
	assert.Equal(t, map[string]string{"fleet": "East"}, ro.attrsOf(t, "d"))
	assert.Error(t, ro.Assign(context.Background(), []buckets.Assignment{set("d", at(time.Second), "fleet", "West")}))
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
