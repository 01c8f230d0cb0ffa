package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/partition"
)

// clusterFixture is what a cluster test publishes: readings of devices
// at fixed times, so any store that holds them answers the same.
type clusterFixture struct {
	devices  int
	readings int // per device
	start    time.Time
}

func (f clusterFixture) device(i int) string { return fmt.Sprintf("dev-%04d", i) }

func (f clusterFixture) ts(r int) time.Time { return f.start.Add(time.Duration(r) * time.Minute) }

func (f clusterFixture) payload(i, r int) []byte {
	return fmt.Appendf(nil, `{"ts":%d,"temp":%d.5,"hum":%d,"ok":%t}`, f.ts(r).UnixMilli(), i%40, (i*7+r)%100, r%2 == 0)
}

// publishAll publishes every reading, spreading the messages over the
// given connections (any NATS node), and waits for every ack. Acks are
// awaited every 1,000 messages, well below the clients' limit of
// outstanding ones, so a slow server delays the publisher instead of
// failing it (a stalled async publish is an error after 200 ms).
func (f clusterFixture) publishAll(t *testing.T, conns ...jetstream.JetStream) {
	t.Helper()
	var acks []jetstream.PubAckFuture
	k := 0
	for r := range f.readings {
		for i := range f.devices {
			js := conns[k%len(conns)]
			k++
			a, err := js.PublishAsync("telemetry."+f.device(i), f.payload(i, r))
			require.NoError(t, err)
			if acks = append(acks, a); len(acks) == 1000 {
				acks = awaitAcks(t, acks)
			}
		}
	}
	awaitAcks(t, acks)
}

// awaitAcks waits for every publish of acks to be acked, requires no
// error, and returns acks emptied for reuse.
func awaitAcks(t *testing.T, acks []jetstream.PubAckFuture) []jetstream.PubAckFuture {
	t.Helper()
	for _, a := range acks {
		select {
		case <-a.Ok():
		case err := <-a.Err():
			require.NoError(t, err)
		}
	}
	return acks[:0]
}

func jsFor(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	require.NoError(t, err)
	return js
}

// walk GETs path and follows its next cursors, asking the bases in
// turn (so a cursor made by one node is continued by the next), and
// returns every page's body.
func walk(t *testing.T, bases []string, path string) []string {
	t.Helper()
	var pages []string
	next := ""
	for i := 0; ; i++ {
		p := path
		if next != "" {
			p += "&cursor=" + url.QueryEscape(next)
		}
		code, body := getBody(t, bases[i%len(bases)]+p)
		require.Equal(t, 200, code, "GET %s via %s: %s", p, bases[i%len(bases)], body)
		pages = append(pages, body)
		var v struct {
			Next string `json:"next"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &v))
		if v.Next == "" {
			return pages
		}
		next = v.Next
		require.Less(t, i, 10000, "cursor loop")
	}
}

// trailingMark is the partial marker of an answer read from a copy that
// could not show it settled its stream within the bound (a loaded
// machine's NATS answering late), at the end of the answer's object.
var trailingMark = regexp.MustCompile(`,"warnings":\["partial: partition \d+ was read from a copy trailing its stream[^"]*"(,"partial: partition \d+ was read from a copy trailing its stream[^"]*")*\]\}`)

// withoutTrailingMarks takes the partial markers out of pages, so that
// a complete answer that carries one compares equal: the marker says
// readings may be missing, and the comparison shows none is.
func withoutTrailingMarks(t *testing.T, pages []string) []string {
	out := make([]string, len(pages))
	for i, p := range pages {
		out[i] = trailingMark.ReplaceAllString(p, "}")
		if out[i] != p {
			t.Logf("answer marked partial (a copy trailing its stream): %s", p)
		}
	}
	return out
}

// TestClusterAcceptance: three NATS JetStream servers in a cluster,
// three telemetryd nodes with -partitions 12 -copies 2. Devices publish
// through every NATS server; every reading is stored on exactly two
// nodes; every query through every node answers byte for byte what a
// single node answers on the same data (cursors continued on other
// nodes included).
func TestClusterAcceptance(t *testing.T) {
	inLane(t, lanes.cluster)
	fx := clusterFixture{devices: 1000, readings: 3, start: testEpoch.Add(-2 * time.Hour)}
	if longCluster() {
		fx.readings = 30
	}
	nc := startNATSCluster(t, 3)
	clock := testClock()
	var nodes []*testNode
	var names []string
	for i := range 3 {
		cfg := clusterNodeConfig(t, nc, i, 12)
		nodes = append(nodes, startNode(t, cfg, clock))
		names = append(names, cfg.Cluster.NodeName)
	}
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) },
			"%s never saw 12 partitions with two caught-up owners", n.cfg.Cluster.NodeName)
	}
	// The stream is partitioned and replicated on all three servers.
	js := jsFor(t, nc.url(0))
	st, err := js.Stream(context.Background(), "TELEMETRY")
	require.NoError(t, err)
	assert.Equal(t, 3, st.CachedInfo().Config.Replicas)
	parts, err := partition.Count("telemetry", st.CachedInfo().Config.SubjectTransform)
	require.NoError(t, err)
	assert.Equal(t, 12, parts)

	refCfg := newTestConfig(t)
	refCfg.Security.CursorKey = testCursorKey
	ref := startService(t, refCfg, func(m *Main) { m.now = clock })

	fx.publishAll(t, jsFor(t, nc.url(0)), jsFor(t, nc.url(1)), jsFor(t, nc.url(2)))
	fx.publishAll(t, ref.js)

	// Every reading on the two owners of its partition (a node that
	// consumed it while a lease lapsed keeps a copy; checked below).
	waitFor(t, 200*time.Millisecond, func() bool {
		for i := range fx.devices {
			if storedOn(t, ref.Main, fx.device(i)) != fx.readings {
				return false
			}
			owners := nodes[0].main().cluster.members.Desired(partition.Of(12, fx.device(i)))
			if len(owners) != 2 {
				return false
			}
			for _, n := range nodes {
				if slices.Contains(owners, n.cfg.Cluster.NodeName) && storedOn(t, n.main(), fx.device(i)) != fx.readings {
					return false
				}
			}
		}
		return true
	}, "every reading stored on the two owners of its partition")
	// A node stores only its partitions: a copy on a node that does not
	// own the device's partition comes only from a lease that lapsed
	// (a loaded machine), which touches a few partitions, never most.
	elsewhere := 0
	for i := range fx.devices {
		dev := fx.device(i)
		owners := nodes[0].main().cluster.members.Desired(partition.Of(12, dev))
		for _, n := range nodes {
			if !slices.Contains(owners, n.cfg.Cluster.NodeName) && storedOn(t, n.main(), dev) > 0 {
				elsewhere++
			}
		}
	}
	assert.Less(t, elsewhere, fx.devices/2, "devices with a copy on a node that does not own them")

	bases := []string{nodes[0].base, nodes[1].base, nodes[2].base}
	same := func(path string) {
		t.Helper()
		want := walk(t, []string{ref.base}, path)
		for k := range bases {
			rotated := append(append([]string{}, bases[k:]...), bases[:k]...)
			assert.Equal(t, want, withoutTrailingMarks(t, walk(t, rotated, path)), "GET %s starting at node %d", path, k)
		}
	}
	same("/v1/devices?limit=97")
	same("/v1/devices?prefix=dev-01&limit=7")
	from, to := fx.start.UnixMilli(), fx.ts(fx.readings).UnixMilli()
	at := strconv.FormatInt(fx.ts(fx.readings-1).Unix(), 10)
	for _, i := range []int{0, 1, 17, 333, 500, 998, 999} {
		dev := fx.device(i)
		same("/v1/devices/" + dev + "/readings/latest?limit=2&x=")
		same(fmt.Sprintf("/v1/devices/%s/readings?from=%d&to=%d&limit=1", dev, from, to))
		same(fmt.Sprintf("/v1/devices/%s/readings?from=%d&to=%d&order=asc&limit=2&fields=temp", dev, from, to))
		same(fmt.Sprintf("/v1/devices/%s/readings/%d?x=", dev, fx.ts(1).UnixMilli()))
		same(fmt.Sprintf("/v1/devices/%s/aggregates?from=%d&to=%d&interval=1m&limit=1", dev, from, to))
	}
	for _, q := range []string{"count(temp)", "sum(hum)", "max(max_over_time(temp[3h]))", `temp{device="dev-0500"}`, `count(ok == 1)`} {
		same("/api/v1/query?query=" + url.QueryEscape(q) + "&time=" + at)
		same("/api/v1/query_range?query=" + url.QueryEscape(q) + "&start=" + strconv.FormatInt(fx.start.Unix(), 10) + "&end=" + at + "&step=60")
	}
	same("/api/v1/label/device/values?x=")
	// A device nobody has: an empty tail, and a point query is a 404
	// on every node, like on one.
	same("/v1/devices/nobody/readings/latest?x=")
	for _, b := range append(bases, ref.base) {
		code, _ := getBody(t, b+"/v1/devices/nobody/readings/"+strconv.FormatInt(fx.ts(1).UnixMilli(), 10))
		assert.Equal(t, 404, code)
	}
	// Tables: the same days on every node.
	var refTables, tables struct {
		Tables []struct {
			Day string `json:"day"`
		} `json:"tables"`
	}
	_, body := getBody(t, ref.base+"/v1/tables")
	require.NoError(t, json.Unmarshal([]byte(body), &refTables))
	for _, b := range bases {
		_, body := getBody(t, b+"/v1/tables")
		require.NoError(t, json.Unmarshal([]byte(body), &tables))
		assert.Equal(t, refTables, tables)
	}

	// DELETE /v1/tables/{day} through one node drops the day on all.
	day := fx.start.Format(time.DateOnly)
	req, err := http.NewRequest(http.MethodDelete, nodes[1].base+"/v1/tables/"+day, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	for _, n := range nodes {
		// At once on every live node; a node whose lease a loaded machine
		// let lapse for a moment was skipped and drops the day when it
		// reads the cluster-wide record (TestClusterDeleteReachesANodeThatWasDown).
		waitFor(t, 100*time.Millisecond, func() bool {
			ts, err := n.main().store.Tables(context.Background())
			require.NoError(t, err)
			return len(ts) == 0
		}, "%s still has a table", n.cfg.Cluster.NodeName)
		code, body := getBody(t, n.base+"/v1/devices/"+fx.device(5)+"/readings/latest?limit=1")
		assert.Equal(t, 200, code)
		assert.Contains(t, body, `"readings":[]`, "the dropped day answers nothing through %s", n.cfg.Cluster.NodeName)
	}
	req, err = http.NewRequest(http.MethodDelete, nodes[2].base+"/v1/tables/"+day, nil)
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "no node has the day any more")
}
