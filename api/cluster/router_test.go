package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/auth"
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

func (m *memLocal) Devices(_ context.Context, q buckets.DeviceQuery) ([]buckets.DeviceInfo, bool, error) {
	prefix, after, limit := q.Prefix, q.After, q.Limit
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

// testCredential is the cluster credential of the test nodes.
const testCredential = "cluster-credential-of-the-tests"

// serve runs a node's internal API over local.
func serve(t *testing.T, local Local, v view) string {
	t.Helper()
	srv := httptest.NewServer(NewHandler(local, v.PartitionOf, testCredential, nil, nil))
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
	r, err := New(Config{Local: &memLocal{}, Membership: v, Credential: testCredential})
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
	r, err = New(Config{Local: &memLocal{}, Membership: v, Credential: testCredential})
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
	r, err := New(Config{Local: self, Membership: v, Credential: testCredential})
	require.NoError(t, err)

	devs, more, err := r.Devices(context.Background(), buckets.DeviceQuery{Limit: 10})
	require.NoError(t, err)
	var names []string
	for _, d := range devs {
		names = append(names, string(d.Device))
	}
	assert.Equal(t, []string{"a0", "b1", "c2", "d3", "e5"}, names)
	assert.False(t, more)

	devs, more, err = r.Devices(context.Background(), buckets.DeviceQuery{After: "b1", Limit: 2})
	require.NoError(t, err)
	require.Len(t, devs, 2)
	assert.Equal(t, buckets.DeviceID("c2"), devs[0].Device)
	assert.Equal(t, buckets.DeviceID("d3"), devs[1].Device)
	assert.True(t, more)
}

// TestHandlerAppliesTheCallersRights: the node-to-node API answers only
// calls with the cluster credential, and gives the client token each
// call names exactly its public rights: scope read to read, admin to
// drop, and only the devices of its patterns.
func TestHandlerAppliesTheCallersRights(t *testing.T) {
	local := &memLocal{rs: []buckets.Reading{reading("a1", 1, 1), reading("b2", 1, 2), reading("a3", 1, 3)}}
	tokens := map[string]*auth.Principal{
		"reader": auth.NewPrincipal("reader", []auth.Scope{auth.ScopeRead}, []string{"a*"}),
		"admin":  auth.NewPrincipal("admin", []auth.Scope{auth.ScopeAdmin}, nil),
	}
	callers := func(name string) (*auth.Principal, bool) { p, ok := tokens[name]; return p, ok }
	v := view{owners: map[int][]Peer{}}
	srv := httptest.NewServer(NewHandler(local, v.PartitionOf, testCredential, callers, nil))
	t.Cleanup(srv.Close)
	call := func(credential, caller, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		if credential != "" {
			req.Header.Set("Authorization", "Bearer "+credential)
		}
		if caller != "" {
			req.Header.Set(HeaderCaller, caller)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}
	latest := func(dev string) string { return `{"device":"` + dev + `","n":1}` }

	code, _ := call("", "token reader", pathLatest, latest("a1"))
	assert.Equal(t, http.StatusUnauthorized, code, "no credential")
	code, _ = call("wrong-credential-of-some-client", "token reader", pathLatest, latest("a1"))
	assert.Equal(t, http.StatusUnauthorized, code, "a client's token is not the credential")
	code, body := call(testCredential, "", pathLatest, latest("a1"))
	assert.Equal(t, http.StatusForbidden, code, "no caller named")
	assert.Contains(t, body, HeaderCaller)
	code, body = call(testCredential, "token nobody", pathLatest, latest("a1"))
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, `token \"nobody\" is not in this node's auth file`)
	code, _ = call(testCredential, "open", pathLatest, latest("a1"))
	assert.Equal(t, http.StatusForbidden, code, "a node without authentication cannot speak for a client here")

	code, _ = call(testCredential, "token reader", pathLatest, latest("a1"))
	assert.Equal(t, http.StatusOK, code)
	for path, body := range map[string]string{
		pathLatest:    latest("b2"),
		pathRange:     `{"Device":"b2"}`,
		pathGet:       `{"device":"b2","ticks":1}`,
		pathAggregate: `{"Device":"b2"}`,
	} {
		code, _ = call(testCredential, "token reader", path, body)
		assert.Equal(t, http.StatusNotFound, code, "%s of a device outside the patterns", path)
	}
	code, body = call(testCredential, "token reader", pathDevices, `{"limit":10,"partitions":[0,1]}`)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `{"d":"b2","f":0,"l":0,"v":null,"h":true}`, "a hidden device is a bare position")
	assert.Contains(t, body, `"d":"a3","f":1,"l":1,"v":"`)
	code, _ = call(testCredential, "token reader", pathDrop, `{"day":20000}`)
	assert.Equal(t, http.StatusForbidden, code, "read cannot drop")

	code, _ = call(testCredential, "token admin", pathLatest, latest("a1"))
	assert.Equal(t, http.StatusForbidden, code, "admin cannot read")
	code, _ = call(testCredential, "token admin", pathDrop, `{"day":20000}`)
	assert.Equal(t, http.StatusOK, code)
}
