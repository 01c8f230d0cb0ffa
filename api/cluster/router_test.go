package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
)

// memLocal is a store of a few readings, enough to answer the router's
// calls (a fake at the consumer-declared Local).
type memLocal struct {
	mu       sync.Mutex
	rs       []buckets.Reading
	attrs    map[buckets.DeviceID]buckets.Attributes
	assigned []buckets.Assignment
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
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []buckets.DeviceInfo
	for _, d := range m.all() {
		if strings.HasPrefix(string(d.Device), q.Prefix) && d.Device > q.After && selects(q, &d) {
			out = append(out, d)
		}
	}
	if len(out) > q.Limit {
		return out[:q.Limit], true, nil
	}
	return out, false, nil
}

// all is every device, sorted, with its attributes (m.mu held).
func (m *memLocal) all() []buckets.DeviceInfo {
	var out []buckets.DeviceInfo
	for _, r := range m.rs {
		if !slices.ContainsFunc(out, func(d buckets.DeviceInfo) bool { return d.Device == r.Device }) {
			out = append(out, buckets.DeviceInfo{Device: r.Device, FirstSeen: r.Ticks, LastSeen: r.Ticks, Latest: r.Values, Attributes: m.attrs[r.Device]})
		}
	}
	for dev, a := range m.attrs {
		if !slices.ContainsFunc(out, func(d buckets.DeviceInfo) bool { return d.Device == dev }) {
			out = append(out, buckets.DeviceInfo{Device: dev, Attributes: a})
		}
	}
	slices.SortFunc(out, func(a, b buckets.DeviceInfo) int { return strings.Compare(string(a.Device), string(b.Device)) })
	return out
}

// selects reports whether q keeps d, as the store decides.
func selects(q buckets.DeviceQuery, d *buckets.DeviceInfo) bool {
	for _, mt := range q.Match {
		v, _ := d.Attributes.Get(mt.Name)
		if mt.Name == "device" {
			v = string(d.Device)
		}
		if !mt.Matches(v) {
			return false
		}
	}
	if q.SilentBefore != 0 && d.LastSeen >= q.SilentBefore {
		return false
	}
	return q.Visible == nil || q.Visible(d.Device)
}

func (m *memLocal) Device(_ context.Context, dev buckets.DeviceID) (buckets.DeviceInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.all() {
		if d.Device == dev {
			return d, nil
		}
	}
	return buckets.DeviceInfo{}, fmt.Errorf("device %s: %w", dev, buckets.ErrNotFound)
}

// Assign sets (or, with Replace, replaces) attributes; it refuses a set
// of more than one attribute named "bad" as the store refuses invalid
// ones.
// AttributeState lists the assignments this store was given, of the
// devices keep selects, all in one page.
func (m *memLocal) AttributeState(_ context.Context, _ buckets.DeviceID, _ int, keep func(buckets.DeviceID) bool) ([]buckets.Assignment, buckets.DeviceID, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []buckets.Assignment
	for _, a := range m.assigned {
		if keep(a.Device) {
			out = append(out, a)
		}
	}
	return out, "", false, nil
}

func (m *memLocal) Assign(_ context.Context, as []buckets.Assignment) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range as {
		if _, bad := a.Set.Get("bad"); bad {
			return buckets.Invalid(buckets.CodeInvalidAttributeValue, -1, "attributes.bad", "refused")
		}
	}
	if m.attrs == nil {
		m.attrs = map[buckets.DeviceID]buckets.Attributes{}
	}
	for _, a := range as {
		m.assigned = append(m.assigned, a)
		cur := map[string]string{}
		if !a.Replace {
			cur = m.attrs[a.Device].Map()
		}
		for _, x := range a.Set {
			cur[x.Name] = x.Value
		}
		for _, n := range a.Remove {
			delete(cur, n)
		}
		set, _ := buckets.NewAttributes(cur)
		m.attrs[a.Device] = set
	}
	return nil
}

func (m *memLocal) AttributeNames(ctx context.Context, q buckets.DeviceQuery) ([]string, error) {
	return m.AttributeValues(ctx, "", q)
}

func (m *memLocal) AttributeValues(_ context.Context, name string, q buckets.DeviceQuery) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, d := range m.all() {
		if !strings.HasPrefix(string(d.Device), q.Prefix) || !selects(q, &d) {
			continue
		}
		for _, a := range d.Attributes {
			switch {
			case name == "":
				out = append(out, a.Name)
			case a.Name == name:
				out = append(out, a.Value)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
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

func (m *memLocal) DeleteDevice(_ context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.rs)
	m.rs = slices.DeleteFunc(m.rs, func(r buckets.Reading) bool { return r.Device == dev })
	if len(m.rs) == n {
		return buckets.DeviceDelete{Device: dev, Readings: -1}, fmt.Errorf("device %s: %w", dev, buckets.ErrNotFound)
	}
	return buckets.DeviceDelete{Device: dev, Readings: int64(n - len(m.rs))}, nil
}

// view is a fixed membership: partition = last digit of the device ID
// mod 2; owners listed per partition.
type view struct {
	owners  map[int][]Peer
	holders map[int][]Peer // nil: the owners
	nodes   []Peer
}

func (v view) Partitions() int { return 2 }
func (v view) PartitionOf(dev buckets.DeviceID) int {
	return int(dev[len(dev)-1]-'0') % 2
}
func (v view) Owners(p int) []Peer { return v.owners[p] }
func (v view) Nodes() []Peer       { return v.nodes }
func (v view) Holders(p int) []Peer {
	if v.holders == nil {
		return v.owners[p]
	}
	return v.holders[p]
}

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

// unavailableLocal is a store whose reads are unavailable (a table
// being repaired, a full disk).
type unavailableLocal struct{ memLocal }

func (u *unavailableLocal) Latest(context.Context, buckets.DeviceID, int) ([]buckets.Reading, error) {
	return nil, fmt.Errorf("table 2026-12-05: %w", buckets.ErrUnavailable)
}

// TestRouterOwnCopyUnavailable: when this node's copy cannot be read,
// the next owner answers; when no owner can, the error names the
// partition for the client (and no node).
func TestRouterOwnCopyUnavailable(t *testing.T) {
	remote := &memLocal{rs: []buckets.Reading{reading("d1", 10, 1.5)}}
	v := view{owners: map[int][]Peer{}}
	v.owners[1] = []Peer{{Node: "self", Self: true}, {Node: "b", URL: serve(t, remote, v)}}
	r, err := New(Config{Local: &unavailableLocal{}, Membership: v, Credential: testCredential})
	require.NoError(t, err)
	rs, err := r.Latest(context.Background(), "d1", 5)
	require.NoError(t, err, "the other owner answers")
	require.Len(t, rs, 1)

	v.owners[1] = []Peer{{Node: "self", Self: true}}
	r, err = New(Config{Local: &unavailableLocal{}, Membership: v, Credential: testCredential})
	require.NoError(t, err)
	_, err = r.Latest(context.Background(), "d1", 5)
	require.ErrorIs(t, err, buckets.ErrUnavailable)
	var ue *UnavailableError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, 1, ue.Partition)
	assert.Equal(t, "partition 1: no owner answered (1 asked); retry later", ue.ClientMessage())
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
	local := &memLocal{rs: []buckets.Reading{reading("a1", 1, 1), reading("b2", 1, 2), reading("a3", 1, 3)},
		attrs: map[buckets.DeviceID]buckets.Attributes{"b2": {{Name: "fleet", Value: "West"}, {Name: "route", Value: "x"}}}}
	tokens := map[string]*auth.Principal{
		"reader":  auth.NewPrincipal("reader", []auth.Scope{auth.ScopeRead}, []string{"a*"}),
		"writer":  auth.NewPrincipal("writer", []auth.Scope{auth.ScopeRead, auth.ScopeWrite}, []string{"a*"}),
		"admin":   auth.NewPrincipal("admin", []auth.Scope{auth.ScopeAdmin}, nil),
		"admin-a": auth.NewPrincipal("admin-a", []auth.Scope{auth.ScopeAdmin}, []string{"a*"}),
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
	// A node's own call reads only a partition's attribute state, and
	// only with the credential.
	code, body = call(testCredential, callerNode, pathLatest, latest("b2"))
	assert.Equal(t, http.StatusForbidden, code, "a node's own call read a device: %s", body)
	code, _ = call(testCredential, callerNode, pathAssign, `{"assignments":[{"device":"b2","at":1,"set":{"fleet":"x"}}]}`)
	assert.Equal(t, http.StatusForbidden, code, "a node's own call wrote attributes")
	code, _ = call("", callerNode, pathAttrState, `{"partitions":[0,1,2,3],"limit":10}`)
	assert.Equal(t, http.StatusUnauthorized, code, "no credential")
	code, body = call(testCredential, callerNode, pathAttrState, `{"partitions":[0,1,2,3],"limit":10}`)
	assert.Equal(t, http.StatusOK, code, body)
	for _, limit := range []int{0, attrStatePage + 1} {
		code, body = call(testCredential, callerNode, pathAttrState, fmt.Sprintf(`{"partitions":[0],"limit":%d}`, limit))
		assert.Equal(t, http.StatusBadRequest, code, "limit %d: %s", limit, body)
	}
	code, body = call(testCredential, callerNode, pathAttrState, fmt.Sprintf(`{"partitions":[0],"limit":%d}`, attrStatePage))
	assert.Equal(t, http.StatusOK, code, body)

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
	assert.NotContains(t, body, `"b2"`, "a hidden device is not even a position")
	assert.Contains(t, body, `"d":"a3","f":1,"l":1,"v":"`)
	for path, body := range map[string]string{
		pathDevice: `{"device":"b2"}`,
		pathAssign: `{"assignments":[{"device":"b2","at":5,"set":{"fleet":"East"}}]}`,
	} {
		code, _ = call(testCredential, "token writer", path, body)
		assert.Equal(t, http.StatusNotFound, code, "%s of a device outside the patterns", path)
	}
	code, _ = call(testCredential, "token reader", pathAssign, `{"assignments":[{"device":"a1","at":5,"set":{"fleet":"East"}}]}`)
	assert.Equal(t, http.StatusForbidden, code, "read cannot assign")
	code, _ = call(testCredential, "token writer", pathAssign, `{"assignments":[{"device":"a1","at":5,"set":{"fleet":"East"}}]}`)
	assert.Equal(t, http.StatusOK, code)
	code, body = call(testCredential, "token reader", pathAttrs, `{"name":"fleet","partitions":[0,1]}`)
	require.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, `{"values":["East"]}`, body, "b2's West is not learned")
	code, body = call(testCredential, "token reader", pathAttrs, `{"partitions":[0,1]}`)
	require.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, `{"values":["fleet"]}`, body, "b2's secret attribute name is not learned")
	code, _ = call(testCredential, "token reader", pathDrop, `{"day":20000}`)
	assert.Equal(t, http.StatusForbidden, code, "read cannot drop")

	code, _ = call(testCredential, "token admin", pathLatest, latest("a1"))
	assert.Equal(t, http.StatusForbidden, code, "admin cannot read")
	code, _ = call(testCredential, "token admin", pathDrop, `{"day":20000}`)
	assert.Equal(t, http.StatusOK, code)

	code, _ = call(testCredential, "token writer", pathDeleteDevice, `{"device":"a1"}`)
	assert.Equal(t, http.StatusForbidden, code, "write cannot delete a device")
	code, _ = call(testCredential, "token admin-a", pathDeleteDevice, `{"device":"b2"}`)
	assert.Equal(t, http.StatusNotFound, code, "a device outside the patterns")
	assert.Len(t, local.of("b2"), 1, "not deleted")
	code, _ = call(testCredential, "token admin-a", pathDeleteDevice, `{"device":"a1"}`)
	assert.Equal(t, http.StatusOK, code)
	assert.Empty(t, local.of("a1"))
}

// TestRouterAttributes: a device's record comes from an owner, filtered
// lists and attribute values are merged from one owner per partition
// with the matchers carried over the wire, and an assignment reaches
// every owner of its partition.
func TestRouterAttributes(t *testing.T) {
	ctx := context.Background()
	self := &memLocal{rs: []buckets.Reading{reading("a0", 1, 1), reading("b2", 5, 2)},
		attrs: map[buckets.DeviceID]buckets.Attributes{"a0": {{Name: "fleet", Value: "East"}}, "b2": {{Name: "fleet", Value: "West"}},
			"c1": {{Name: "fleet", Value: "Stale"}}}} // c1: partition 1, which this node no longer answers for
	remote := &memLocal{rs: []buckets.Reading{reading("c1", 1, 3), reading("d3", 9, 4)},
		attrs: map[buckets.DeviceID]buckets.Attributes{"c1": {{Name: "fleet", Value: "East"}, {Name: "model", Value: "F-150"}}}}
	copy1 := &memLocal{}
	v := view{owners: map[int][]Peer{}}
	remoteURL := serve(t, remote, v)
	v.owners[0] = []Peer{{Node: "self", Self: true}, {Node: "copy", URL: serve(t, copy1, v)}}
	v.owners[1] = []Peer{{Node: "b", URL: remoteURL}}
	r, err := New(Config{Local: self, Membership: v, Credential: testCredential})
	require.NoError(t, err)

	d, err := r.Device(ctx, "c1")
	require.NoError(t, err)
	assert.Equal(t, buckets.Attributes{{Name: "fleet", Value: "East"}, {Name: "model", Value: "F-150"}}, d.Attributes, "from the owner")
	_, err = r.Device(ctx, "z1")
	assert.ErrorIs(t, err, buckets.ErrNotFound)

	east, err := buckets.NewMatcher(buckets.MatchEqual, "fleet", "East")
	require.NoError(t, err)
	devs, more, err := r.Devices(ctx, buckets.DeviceQuery{Limit: 10, Match: []*buckets.Matcher{east}})
	require.NoError(t, err)
	assert.False(t, more)
	var names []string
	for _, d := range devs {
		names = append(names, string(d.Device))
	}
	assert.Equal(t, []string{"a0", "c1"}, names, "the stale c1 of this node is not answered from here")
	require.Len(t, devs, 2)
	assert.Equal(t, "F-150", devs[1].Attributes.Map()["model"], "attributes cross the wire")

	devs, _, err = r.Devices(ctx, buckets.DeviceQuery{Limit: 10, SilentBefore: 6})
	require.NoError(t, err)
	names = nil
	for _, d := range devs {
		names = append(names, string(d.Device))
	}
	assert.Equal(t, []string{"a0", "b2", "c1"}, names, "silence crosses the wire (d3 is not silent)")

	vals, err := r.AttributeValues(ctx, "fleet", buckets.DeviceQuery{})
	require.NoError(t, err)
	assert.Equal(t, []string{"East", "West"}, vals)
	vals, err = r.AttributeNames(ctx, buckets.DeviceQuery{Match: []*buckets.Matcher{east}})
	require.NoError(t, err)
	assert.Equal(t, []string{"fleet", "model"}, vals)

	require.NoError(t, r.Assign(ctx, []buckets.Assignment{
		{Device: "a0", At: 7, Set: buckets.Attributes{{Name: "depot", Value: "Leeds"}}},
		{Device: "d3", At: 7, Set: buckets.Attributes{{Name: "fleet", Value: "North"}}, Replace: true},
	}))
	assert.Len(t, self.assigned, 1, "partition 0: this node")
	assert.Len(t, copy1.assigned, 1, "partition 0: and its other owner")
	require.Len(t, remote.assigned, 1, "partition 1: its owner")
	assert.Equal(t, buckets.Assignment{Device: "d3", At: 7, Set: buckets.Attributes{{Name: "fleet", Value: "North"}}, Replace: true}, remote.assigned[0])

	err = r.Assign(ctx, []buckets.Assignment{{Device: "d3", At: 8, Set: buckets.Attributes{{Name: "bad", Value: "x"}}}})
	var ve *buckets.ValidationError
	require.ErrorAs(t, err, &ve, "a refusal crosses the wire with its code")
	assert.Equal(t, buckets.CodeInvalidAttributeValue, ve.Code)
	assert.Equal(t, "attributes.bad", ve.Field)

	v.owners[0] = append(v.owners[0], Peer{Node: "dead", URL: "http://127.0.0.1:1"})
	err = r.Assign(ctx, []buckets.Assignment{{Device: "a0", At: 9, Remove: []string{"depot"}}})
	assert.ErrorIs(t, err, buckets.ErrUnavailable, "an owner that did not take it fails the write")
	assert.Contains(t, err.Error(), "dead")
}

// TestRouterDropTellsDropped: a cluster-wide drop tells each node's
// Dropped of its own store's drop, both for the node that asked and for
// a node called over the wire, and the total adds up every node's.
func TestRouterDropTellsDropped(t *testing.T) {
	var selfDrops, otherDrops []buckets.TableDrop
	other, err := New(Config{Local: &memLocal{rs: []buckets.Reading{reading("b1", 1, 1)}}, Membership: view{},
		Credential: testCredential, Dropped: func(_ context.Context, d buckets.TableDrop) { otherDrops = append(otherDrops, d) }})
	require.NoError(t, err)
	srv := httptest.NewServer(other.Handler())
	t.Cleanup(srv.Close)
	v := view{nodes: []Peer{{Node: "a", Self: true}, {Node: "b", URL: srv.URL}}}
	self := &memLocal{rs: []buckets.Reading{reading("a0", 1, 1), reading("c2", 1, 1)}}
	r, err := New(Config{Local: self, Membership: v, Credential: testCredential,
		Dropped: func(_ context.Context, d buckets.TableDrop) { selfDrops = append(selfDrops, d) }})
	require.NoError(t, err)

	day := buckets.Day(20000)
	total, err := r.DropTable(context.Background(), day)
	require.NoError(t, err)
	assert.Equal(t, int64(3), total.SizeBytes, "both nodes' drops add up")
	require.Len(t, selfDrops, 1)
	assert.Equal(t, buckets.TableDrop{Day: day, SizeBytes: 2}, selfDrops[0])
	require.Len(t, otherDrops, 1, "the called node counts its own drop")
	assert.Equal(t, buckets.TableDrop{Day: day, SizeBytes: 1}, otherDrops[0])
}
