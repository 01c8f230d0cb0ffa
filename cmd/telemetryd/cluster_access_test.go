package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// Fleet of the access tests: a few devices a narrow token sees, after
// more than one listing's scan (10,000) of devices it does not.
const (
	accessVisible = 30     // dev-a000 ... dev-a029
	accessHidden  = 10_050 // card-000000 ... card-010049, listed first
	// accessBurst is the client rate limit of the access tests: a burst
	// of this many requests per token (or address) and then next to no
	// refill, so one more request is refused whatever the machine's speed.
	accessBurst = 60
	accessRate  = 0.0001
)

// startAccessCluster starts three nodes with an auth file and the tiny
// rate limit, publishes the fleet and waits until every reading is on
// its two owners.
func startAccessCluster(t *testing.T, af *authFixture) []*testNode {
	t.Helper()
	nc := startNATSCluster(t, 1)
	nodes := startConvergedNodes(t, nc, 3, 2, func(cfg *Config) {
		cfg.Security.AuthFile = af.path
		cfg.Cluster.ClusterToken = af.tokens["cluster"]
		cfg.Security.HTTPRate, cfg.Security.HTTPBurst = accessRate, accessBurst
	})
	js := jsFor(t, nc.url(0))
	var acks []jetstream.PubAckFuture
	// Acks are awaited every 1,000 messages, well below the client's
	// limit of outstanding ones, so a slow server delays the publisher
	// instead of failing it.
	publish := func(dev string, i int) {
		a, err := js.PublishAsync("telemetry."+dev, fmt.Appendf(nil, `{"ts":%d,"v":%d}`, testEpoch.Add(-time.Hour).UnixMilli(), i))
		require.NoError(t, err)
		if acks = append(acks, a); len(acks) == 1000 {
			acks = awaitAcks(t, acks)
		}
	}
	for i := range accessHidden {
		publish(fmt.Sprintf("card-%06d", i), i)
	}
	for i := range accessVisible {
		publish(fmt.Sprintf("dev-a%03d", i), i)
	}
	awaitAcks(t, acks)
	// Each device on its two owners: 2 x the fleet in the nodes' indexes.
	want := 2 * (accessHidden + accessVisible)
	waitFor(t, 200*time.Millisecond, func() bool {
		total := 0
		for _, n := range nodes {
			total += localDevices(t, n.main())
		}
		return total == want
	}, "every device stored on its two owners")
	return nodes
}

// localDevices counts the devices in node m's own index of the
// partitions it owns by its view of the leases. A node whose lease
// lapsed on a loaded machine may meanwhile have consumed another's
// partition, and keeps that copy (never read, removed by a delete), so
// a count of every device would never settle.
func localDevices(t *testing.T, m *Main) int {
	t.Helper()
	mem := m.cluster.members
	n := 0
	var after buckets.DeviceID
	for {
		devs, more, err := m.store.Devices(context.Background(), buckets.DeviceQuery{After: after, Limit: 1000})
		require.NoError(t, err)
		for _, d := range devs {
			if slices.Contains(mem.Desired(partition.Of(mem.Partitions(), string(d.Device))), mem.Node()) {
				n++
			}
		}
		if !more || len(devs) == 0 {
			return n
		}
		after = devs[len(devs)-1].Device
	}
}

// accessCall sends a request with a bearer token and, if set, a
// Telemetry-Caller header, and returns the status and body.
func accessCall(t *testing.T, method, url, token, caller, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if caller != "" {
		req.Header.Set("Telemetry-Caller", caller)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestClusterAccess: three nodes with an auth file.
//
//   - The node-to-node API takes only the cluster credential: an
//     admin-only token (which may not read) and a read token are
//     refused (403) on every internal endpoint of every node, a claimed
//     caller included; with the credential, the named caller's patterns
//     apply.
//   - A read token limited to dev-a* sees exactly its devices through
//     every node (lists, cursors continued on other nodes, readings,
//     PromQL), and no cursor it is given names a device it cannot see;
//     the 10,050 hidden ones listed first cost it no page (the owners'
//     stores apply its patterns).
//   - Node-to-node calls are not rate limited: with a client burst of
//     60, a PromQL query that makes thousands of calls between nodes is
//     answered through every node, while a client past 60 requests gets
//     429.
func TestClusterAccess(t *testing.T) {
	inLane(t, lanes.cluster)
	af := newAuthFixture(t, nil, "cluster:read,admin", "admin:admin", "reader:read:dev-a*", "fleet:read", "direct:read")
	nodes := startAccessCluster(t, af)
	at := fmt.Sprint(testEpoch.Add(-time.Hour + 30*time.Second).Unix())
	cluster, admin, reader := af.tokens["cluster"], af.tokens["admin"], af.tokens["reader"]

	t.Run("internal endpoints need the cluster credential and apply the caller's rights", func(t *testing.T) {
		ts := buckets.MustTicks(testEpoch.Add(-time.Hour))
		window := fmt.Sprintf(`"Device":"card-000001","From":%d,"To":%d,"Limit":10`, ts-buckets.TicksPerSecond, ts+buckets.TicksPerSecond)
		calls := []struct{ method, path, body string }{
			{"POST", "/internal/v1/latest", `{"device":"card-000001","n":1}`},
			{"POST", "/internal/v1/range", "{" + window + "}"},
			{"POST", "/internal/v1/get", fmt.Sprintf(`{"device":"card-000001","ticks":%d}`, ts)},
			{"POST", "/internal/v1/aggregate", fmt.Sprintf(`{%s,"Interval":%d}`, window, 60*buckets.TicksPerSecond)},
			{"POST", "/internal/v1/devices", `{"limit":10,"partitions":[0,1,2,3,4,5]}`},
			{"GET", "/internal/v1/tables", ""},
		}
		for _, n := range nodes {
			for _, c := range calls {
				code, body := accessCall(t, c.method, n.base+c.path, admin, "", c.body)
				assert.Equal(t, http.StatusForbidden, code, "admin-only token on %s %s: %s", n.cfg.Cluster.NodeName, c.path, body)
			}
			code, _ := accessCall(t, "POST", n.base+calls[0].path, reader, "token fleet", calls[0].body)
			assert.Equal(t, http.StatusForbidden, code, "a client cannot claim to call for another token")
			code, _ = accessCall(t, "POST", n.base+calls[0].path, cluster, "token reader", calls[0].body)
			assert.Equal(t, http.StatusNotFound, code, "the credential carries the caller's patterns: card-* is hidden from reader")
			code, body := accessCall(t, "POST", n.base+"/internal/v1/latest", cluster, "token reader", `{"device":"dev-a001","n":1}`)
			assert.Equal(t, internalReadStatus(n, "dev-a001"), code, body)
			code, _ = accessCall(t, "POST", n.base+calls[0].path, cluster, "token admin", calls[0].body)
			assert.Equal(t, http.StatusForbidden, code, "admin cannot read through a node either")
		}
	})

	t.Run("a token limited to dev-a* sees only its devices through every node", func(t *testing.T) {
		for k := range nodes {
			var seen []string
			next := ""
			for page := 0; ; page++ {
				require.Less(t, page, 10, "cursor loop")
				n := nodes[(k+page)%len(nodes)]
				path := "/v1/devices?limit=1000"
				if next != "" {
					path += "&cursor=" + url.QueryEscape(next)
				}
				code, body := accessCall(t, "GET", n.base+path, reader, "", "")
				require.Equal(t, http.StatusOK, code, body)
				var l struct {
					Devices []struct{ Device string } `json:"devices"`
					Next    string                    `json:"next"`
				}
				require.NoError(t, json.Unmarshal([]byte(body), &l))
				for _, d := range l.Devices {
					seen = append(seen, d.Device)
				}
				if page == 0 {
					// The owners' stores apply the token's patterns: the hidden
					// devices cost no page.
					require.Empty(t, l.Next, "one page holds every visible device")
				}
				if l.Next == "" {
					break
				}
				raw, err := base64.RawURLEncoding.DecodeString(l.Next)
				require.NoError(t, err)
				assert.NotContains(t, string(raw), "card-", "a cursor given to a dev-a* token names no card-* device")
				next = l.Next
			}
			var want []string
			for i := range accessVisible {
				want = append(want, fmt.Sprintf("dev-a%03d", i))
			}
			assert.Equal(t, want, seen, "every visible device exactly once, starting at node %d", k)
		}
		for _, n := range nodes {
			code, body := accessCall(t, "GET", n.base+"/v1/devices/dev-a005/readings/latest", reader, "", "")
			assert.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, `"v":5`)
			code, _ = accessCall(t, "GET", n.base+"/v1/devices/card-000005/readings/latest", reader, "", "")
			assert.Equal(t, http.StatusNotFound, code)
			code, body = accessCall(t, "GET", n.base+"/api/v1/query?query=count(v)&time="+at, reader, "", "")
			assert.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, fmt.Sprintf(`"%d"`, accessVisible), "PromQL counts only the token's devices")
		}
	})

	t.Run("node-to-node calls are not rate limited", func(t *testing.T) {
		// 10,000 devices: about a third of them, over 3,000, are read
		// from another node, 50 times the burst.
		q := url.QueryEscape(`count(v{device=~"card-00.*"})`)
		for _, n := range nodes {
			code, body := accessCall(t, "GET", n.base+"/api/v1/query?query="+q+"&time="+at, af.tokens["fleet"], "", "")
			assert.Equal(t, http.StatusOK, code, "through %s: %s", n.cfg.Cluster.NodeName, body)
			assert.Contains(t, body, `"10000"`)
		}
		direct := af.tokens["direct"]
		for i := range accessBurst {
			code, body := accessCall(t, "GET", nodes[0].base+"/v1/tables", direct, "", "")
			require.Equal(t, http.StatusOK, code, "request %d of the burst: %s", i+1, body)
		}
		code, body := accessCall(t, "GET", nodes[0].base+"/v1/tables", direct, "", "")
		assert.Equal(t, http.StatusTooManyRequests, code, "a client past its burst is limited: %s", body)
	})
}

// TestClusterCallsFromOneAddress: without an auth file the rate limit
// is per client address, and three nodes on one host (or behind one
// proxy) share one. Node-to-node calls carry the cluster credential
// (here derived from the cursor key) and are not counted: PromQL
// queries that make hundreds of calls between the nodes are answered
// through every node, while a client at the same address is limited
// after its burst.
func TestClusterCallsFromOneAddress(t *testing.T) {
	inLane(t, lanes.cluster)
	const devices = 600
	nc := startNATSCluster(t, 1)
	nodes := startConvergedNodes(t, nc, 3, 2, func(cfg *Config) {
		cfg.Security.HTTPRate, cfg.Security.HTTPBurst = accessRate, accessBurst
	})
	js := jsFor(t, nc.url(0))
	ctx := context.Background()
	for i := range devices {
		_, err := js.Publish(ctx, fmt.Sprintf("telemetry.dev-%03d", i), fmt.Appendf(nil, `{"ts":%d,"v":%d}`, testEpoch.Add(-time.Hour).UnixMilli(), i))
		require.NoError(t, err)
	}
	waitFor(t, 200*time.Millisecond, func() bool {
		total := 0
		for _, n := range nodes {
			total += localDevices(t, n.main())
		}
		return total == 2*devices
	}, "every device stored on its two owners")

	at := fmt.Sprint(testEpoch.Add(-time.Hour + 30*time.Second).Unix())
	for _, n := range nodes {
		// About 200 of the 600 devices are read from the other nodes.
		code, body := accessCall(t, "GET", n.base+"/api/v1/query?query=count(v)&time="+at, "", "", "")
		assert.Equal(t, http.StatusOK, code, "through %s: %s", n.cfg.Cluster.NodeName, body)
		assert.Contains(t, body, fmt.Sprintf(`"%d"`, devices))
	}
	// Without an auth file too, the node-to-node API takes only the
	// cluster credential.
	code, body := accessCall(t, "POST", nodes[1].base+"/internal/v1/latest", "", "open", `{"device":"dev-001","n":1}`)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	// The client has made one request to node 0; the rest of its burst
	// passes, and one more is refused.
	for i := range accessBurst - 1 {
		code, body := accessCall(t, "GET", nodes[0].base+"/v1/devices/dev-001/readings/latest", "", "", "")
		require.Equal(t, http.StatusOK, code, "request %d of the burst: %s", i+2, body)
	}
	code, body = accessCall(t, "GET", nodes[0].base+"/v1/devices/dev-001/readings/latest", "", "", "")
	assert.Equal(t, http.StatusTooManyRequests, code, "a client past its burst is limited: %s", body)
}

// TestClusterCredential: -cluster-token is optional (the default is
// derived from -cursor-key: the same on every node that shares the key,
// and not the key), and a short one is refused.
func TestClusterCredential(t *testing.T) {
	inLane(t, lanes.cluster)
	nc := &natsCluster{opts: []*server.Options{{Port: 4222}}}
	cfg := clusterNodeConfig(t, nc, 0, 6)
	cfg.Security.AuthFile = newAuthFixture(t, nil, "reader:read").path
	require.NoError(t, cfg.Validate(), "no -cluster-token needed, with an auth file too")
	derived, err := cfg.clusterCredential()
	require.NoError(t, err)
	assert.Len(t, derived, 64)
	assert.NotContains(t, derived, testCursorKey)
	other := clusterNodeConfig(t, nc, 1, 6)
	again, err := other.clusterCredential()
	require.NoError(t, err)
	assert.Equal(t, derived, again, "every node with the same cursor key derives the same credential")
	other.Security.CursorKey = strings.Repeat("k", 32)
	changed, err := other.clusterCredential()
	require.NoError(t, err)
	assert.NotEqual(t, derived, changed)

	cfg.Cluster.ClusterToken = strings.Repeat("c", 32)
	given, err := cfg.clusterCredential()
	require.NoError(t, err)
	assert.Equal(t, cfg.Cluster.ClusterToken, given)
	cfg.Cluster.ClusterToken = "short"
	assert.ErrorContains(t, cfg.Validate(), "-cluster-token has 5 characters; use at least 16")
}
