package cluster

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// memLocal is a store of a few readings, enough to answer the router's
// calls (a fake at the consumer-declared Local).
type memLocal struct {
	rs []buckets.Reading
}

func (m *memLocal) of(dev buckets.DeviceID) []buckets.Reading {
	var out []buckets.Reading
	for _, r := range m.rs {
		if r.Device == dev {
			out = append(out, r)
		}
	}
	return out
}

func (m *memLocal) Latest(_ context.Context, dev buckets.DeviceID, n int) ([]buckets.Reading, error) {
	rs := m.of(dev)
	return rs[:min(n, len(rs))], nil
}

func (m *memLocal) Range(_ context.Context, q buckets.RangeQuery) (buckets.Page, error) {
	return buckets.Page{Readings: m.of(q.Device)}, nil
}

func (m *memLocal) Get(_ context.Context, dev buckets.DeviceID, k buckets.Ticks) (buckets.Reading, error) {
	for _, r := range m.of(dev) {
		if r.Ticks == k {
			return r, nil
		}
	}
	return buckets.Reading{}, fmt.Errorf("%s at %d: %w", dev, k, buckets.ErrNotFound)
}

func (m *memLocal) Devices(_ context.Context, prefix string, after buckets.DeviceID, limit int) ([]buckets.DeviceInfo, bool, error) {
	var out []buckets.DeviceInfo
	for _, r := range m.rs {
		if strings.HasPrefix(string(r.Device), prefix) && r.Device > after &&
			!slices.ContainsFunc(out, func(d buckets.DeviceInfo) bool { return d.Device == r.Device }) {
			out = append(out, buckets.DeviceInfo{Device: r.Device, FirstSeen: r.Ticks, LastSeen: r.Ticks, Latest: r.Values})
		}
	}
	slices.SortFunc(out, func(a, b buckets.DeviceInfo) int { return strings.Compare(string(a.Device), string(b.Device)) })
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}

func (m *memLocal) Tables(context.Context) ([]buckets.TableInfo, error) {
	return []buckets.TableInfo{{Day: 20000, SizeBytes: int64(len(m.rs)), Readings: int64(len(m.rs))}}, nil
}

func (m *memLocal) Aggregate(context.Context, buckets.AggregateQuery) (buckets.AggregatePage, error) {
	return buckets.AggregatePage{}, nil
}

func (m *memLocal) DropTable(_ context.Context, day buckets.Day) (buckets.TableDrop, error) {
	return buckets.TableDrop{Day: day, SizeBytes: int64(len(m.rs))}, nil
}

// view is a fixed membership: partition = last digit of the device ID
// mod 2; owners listed per partition.
type view struct {
	owners map[int][]Peer
	nodes  []Peer
}

func (v view) Partitions() int { return 2 }
func (v view) PartitionOf(dev buckets.DeviceID) int {
	return int(dev[len(dev)-1]-'0') % 2
}
func (v view) Owners(p int) []Peer { return v.owners[p] }
func (v view) Nodes() []Peer       { return v.nodes }

func reading(dev string, k int64, v float64) buckets.Reading {
	return buckets.Reading{Device: buckets.DeviceID(dev), Ticks: buckets.Ticks(k), Values: []buckets.Field{{Name: "t", Value: buckets.Float(v)}}}
}

// serve runs a node's internal API over local.
func serve(t *testing.T, local Local, v view) string {
	t.Helper()
	srv := httptest.NewServer(NewHandler(local, v.PartitionOf, nil))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestRouterAsksTheNextOwnerWhenOneFails(t *testing.T) {
	remote := &memLocal{rs: []buckets.Reading{reading("d1", 10, 1.5), reading("d3", 11, 2.5)}}
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close() // connection refused
	v := view{owners: map[int][]Peer{}}
	v.owners[1] = []Peer{{Node: "dead", URL: deadURL}, {Node: "b", URL: serve(t, remote, v)}}
	r, err := New(Config{Local: &memLocal{}, Membership: v})
	require.NoError(t, err)

	rs, err := r.Latest(context.Background(), "d1", 5)
	require.NoError(t, err)
	require.Len(t, rs, 1)
	assert.Equal(t, 1.5, rs[0].Values[0].Value.AsFloat(), "the value crossed the wire exactly")

	_, err = r.Get(context.Background(), "d1", 99)
	assert.ErrorIs(t, err, buckets.ErrNotFound, "a not-found answer is an answer, not a failure")

	_, err = r.Latest(context.Background(), "d2", 5) // partition 0: no owner
	assert.ErrorIs(t, err, buckets.ErrUnavailable)
	assert.ErrorContains(t, err, "partition 0 has no caught-up owner")

	v.owners[1] = []Peer{{Node: "dead", URL: deadURL}}
	r, err = New(Config{Local: &memLocal{}, Membership: v})
	require.NoError(t, err)
	_, err = r.Latest(context.Background(), "d1", 5)
	assert.ErrorIs(t, err, buckets.ErrUnavailable)
	assert.ErrorContains(t, err, "every owner failed")
}

// TestRouterDevicesMerge: one owner per partition lists only the
// devices of the partitions it was chosen for (a node holding a stale
// copy of another partition does not show it twice), and the merged
// list is sorted, limited and says when more remain.
func TestRouterDevicesMerge(t *testing.T) {
	self := &memLocal{rs: []buckets.Reading{reading("a0", 1, 1), reading("c2", 1, 1), reading("x1", 1, 1)}} // x1: stale copy
	other := &memLocal{rs: []buckets.Reading{reading("b1", 1, 1), reading("d3", 1, 1), reading("e5", 1, 1)}}
	v := view{owners: map[int][]Peer{}}
	url := serve(t, other, v)
	v.owners[0] = []Peer{{Node: "a", Self: true}}
	v.owners[1] = []Peer{{Node: "b", URL: url}, {Node: "a", Self: true}}
	r, err := New(Config{Local: self, Membership: v})
	require.NoError(t, err)

	devs, more, err := r.Devices(context.Background(), "", "", 10)
	require.NoError(t, err)
	var names []string
	for _, d := range devs {
		names = append(names, string(d.Device))
	}
	assert.Equal(t, []string{"a0", "b1", "c2", "d3", "e5"}, names)
	assert.False(t, more)

	devs, more, err = r.Devices(context.Background(), "", "b1", 2)
	require.NoError(t, err)
	require.Len(t, devs, 2)
	assert.Equal(t, buckets.DeviceID("c2"), devs[0].Device)
	assert.Equal(t, buckets.DeviceID("d3"), devs[1].Device)
	assert.True(t, more)
}
