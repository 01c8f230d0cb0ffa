package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// servesOnly is a node's own state: the partitions it serves now.
func servesOnly(ps ...int) func(int) bool {
	return func(p int) bool {
		for _, q := range ps {
			if q == p {
				return true
			}
		}
		return false
	}
}

// serveNode runs the internal API of a node whose own state says
// which partitions it serves now.
func serveNode(t *testing.T, local Local, serves func(int) bool) string {
	t.Helper()
	r, err := New(Config{Local: local, Membership: view{}, Credential: testCredential, Serves: serves})
	require.NoError(t, err)
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// handedBack is the scene of the stale-view tests. Node X consumed
// partition 1 and handed it back (or withdrew it, trailing its
// stream): its copy has d1's first reading and not the second, nor d3
// at all. Node Y serves partition 1 and has all of it. X still serves
// partition 0 (d0, d2), which Y does not hold at all. The leases the
// asking node read still list X first for both partitions.
type handedBack struct {
	x, y       *memLocal
	xURL, yURL string
}

func newHandedBack(t *testing.T) *handedBack {
	t.Helper()
	s := &handedBack{
		x: &memLocal{rs: []buckets.Reading{reading("d0", 5, 0), reading("d1", 10, 1), reading("d2", 6, 2)}},
		y: &memLocal{rs: []buckets.Reading{reading("d1", 20, 2), reading("d1", 10, 1), reading("d3", 30, 3)}}, // newest first, as Latest answers
	}
	s.xURL = serveNode(t, s.x, servesOnly(0))
	s.yURL = serveNode(t, s.y, servesOnly(1))
	return s
}

// asker is a node that owns nothing, whose view lists X first.
func (s *handedBack) asker(t *testing.T) *Router {
	t.Helper()
	r, err := New(Config{Local: &memLocal{}, Credential: testCredential, Membership: view{owners: map[int][]Peer{
		0: {{Node: "x", URL: s.xURL}},
		1: {{Node: "x", URL: s.xURL}, {Node: "y", URL: s.yURL}},
	}}})
	require.NoError(t, err)
	return r
}

// TestReadsSkipANodeThatNoLongerServesThePartition: a device's reads,
// through another node and through X itself, come from the owner that
// serves the partition, never from X's old copy; with no owner serving
// it, a 503 naming the partition.
func TestReadsSkipANodeThatNoLongerServesThePartition(t *testing.T) {
	ctx := context.Background()
	s := newHandedBack(t)
	x, err := New(Config{Local: s.x, Credential: testCredential, Serves: servesOnly(0),
		Membership: view{owners: map[int][]Peer{1: {{Node: "x", Self: true}, {Node: "y", URL: s.yURL}}}}})
	require.NoError(t, err)

	for name, r := range map[string]*Router{"through another node": s.asker(t), "through x": x} {
		rs, err := r.Latest(ctx, "d1", 1)
		require.NoError(t, err, name)
		require.Len(t, rs, 1, name)
		assert.Equal(t, buckets.Ticks(20), rs[0].Ticks, "%s: the newest reading, from the owner that serves the partition", name)
		p, err := r.Range(ctx, buckets.RangeQuery{Device: "d1", Limit: 10})
		require.NoError(t, err, name)
		assert.Len(t, p.Readings, 2, name)
		rd, err := r.Get(ctx, "d1", 20)
		require.NoError(t, err, name)
		assert.Equal(t, buckets.Ticks(20), rd.Ticks, name)
		d, err := r.Device(ctx, "d3")
		require.NoError(t, err, "%s: a device X never stored is known", name)
		assert.Equal(t, buckets.DeviceID("d3"), d.Device)
	}

	// No owner serves it: a 503 naming the partition, not X's old copy.
	none, err := New(Config{Local: &memLocal{}, Credential: testCredential,
		Membership: view{owners: map[int][]Peer{1: {{Node: "x", URL: s.xURL}}}}})
	require.NoError(t, err)
	_, err = none.Latest(ctx, "d1", 1)
	var ue *UnavailableError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, 1, ue.Partition)
	assert.Equal(t, "partition 1: no owner answered (1 asked); retry later", ue.ClientMessage())
}

// TestListsAndExportsSkipANodeThatNoLongerServesThePartition: a device
// list, attribute values and an export through a node whose view lists
// X first have every device of every partition: partition 1 from Y,
// partition 0 still from X (it serves that one, and Y has none of it).
// Answered by X's old copy, the list lacked d3 and the export ended
// with a success and without d3 and d1's newest reading.
func TestListsAndExportsSkipANodeThatNoLongerServesThePartition(t *testing.T) {
	ctx := context.Background()
	s := newHandedBack(t)
	s.x.attrs = map[buckets.DeviceID]buckets.Attributes{"d1": {{Name: "fleet", Value: "old"}}}
	s.y.attrs = map[buckets.DeviceID]buckets.Attributes{"d1": {{Name: "fleet", Value: "East"}}, "d3": {{Name: "fleet", Value: "West"}}}
	r := s.asker(t)

	devs, more, err := r.Devices(ctx, buckets.DeviceQuery{Limit: 10})
	require.NoError(t, err)
	assert.False(t, more)
	var names []string
	for _, d := range devs {
		names = append(names, string(d.Device))
	}
	assert.Equal(t, []string{"d0", "d1", "d2", "d3"}, names)

	vals, err := r.AttributeValues(ctx, "fleet", buckets.DeviceQuery{})
	require.NoError(t, err)
	assert.Equal(t, []string{"East", "West"}, vals, "the attributes of the copy kept current")

	var out bytes.Buffer
	n, err := api.Export(ctx, r, api.ExportOptions{}, &out, nil)
	require.NoError(t, err)
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var row struct {
			Device string `json:"device"`
			T      float64
		}
		require.NoError(t, json.Unmarshal([]byte(line), &row), line)
		got = append(got, row.Device)
	}
	assert.EqualValues(t, 5, n)
	assert.Equal(t, []string{"d0", "d1", "d1", "d2", "d3"}, got, "every reading of every device once")

	// X alone lists partition 1: no answer rather than its old copy.
	none, err := New(Config{Local: &memLocal{}, Credential: testCredential, Membership: view{owners: map[int][]Peer{
		0: {{Node: "x", URL: s.xURL}}, 1: {{Node: "x", URL: s.xURL}}}}})
	require.NoError(t, err)
	_, _, err = none.Devices(ctx, buckets.DeviceQuery{Limit: 10})
	var ue *UnavailableError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, 1, ue.Partition)
	_, err = api.Export(ctx, none, api.ExportOptions{}, &bytes.Buffer{}, nil)
	require.ErrorIs(t, err, buckets.ErrUnavailable, "an export fails rather than end short")
}

// TestHandlerRefusesPartitionsItDoesNotServe: the node-to-node API of a
// node answers 503 not_serving, naming the partitions, for a read of a
// partition it does not serve now, after the caller's rights are
// checked (a device hidden from the caller is still not found).
func TestHandlerRefusesPartitionsItDoesNotServe(t *testing.T) {
	s := newHandedBack(t)
	call := func(path, body string) (int, errorResponse) {
		req, err := http.NewRequest(http.MethodPost, s.xURL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testCredential)
		req.Header.Set(HeaderCaller, callerOpen)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var e errorResponse
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e
	}
	for _, c := range []struct{ path, body string }{
		{pathLatest, `{"device":"d1","n":1}`},
		{pathRange, `{"Device":"d1","Limit":10}`},
		{pathGet, `{"device":"d1","ticks":10}`},
		{pathAggregate, `{"Device":"d1","Interval":10,"Limit":10}`},
		{pathDevice, `{"device":"d1"}`},
	} {
		code, e := call(c.path, c.body)
		assert.Equal(t, http.StatusServiceUnavailable, code, c.path)
		assert.Equal(t, codeNotServing, e.Code, c.path)
		assert.Equal(t, []int{1}, e.Partitions, c.path)
		assert.Contains(t, e.Message, "partition 1:", c.path)
	}
	code, e := call(pathDevices, `{"limit":10,"partitions":[0,1]}`)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, []int{1}, e.Partitions, "only the partition it does not serve")
	code, e = call(pathAttrs, `{"name":"fleet","partitions":[1]}`)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, []int{1}, e.Partitions)

	code, _ = call(pathLatest, `{"device":"d0","n":1}`)
	assert.Equal(t, http.StatusOK, code, "a partition it serves")
	code, _ = call(pathDevices, `{"limit":10,"partitions":[0]}`)
	assert.Equal(t, http.StatusOK, code)
}
