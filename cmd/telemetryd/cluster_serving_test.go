package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/partition"
)

// internalReadStatus is what a node-to-node read of dev, by a caller
// who may see dev, answers on node n: 200 while n serves dev's
// partition (it consumes it and has caught up), else 503 not_serving.
func internalReadStatus(n *testNode, dev string) int {
	m := n.main()
	if m.cluster.node.Serves(partition.Of(m.cluster.members.Partitions(), dev)) {
		return http.StatusOK
	}
	return http.StatusServiceUnavailable
}

// TestClusterHandedBackCopyIsNotRead: node-0 runs alone and stores
// every device, then two nodes join and node-0 hands some partitions
// over, keeping its copy of them as it was. More readings arrive. A
// node whose view of the leases still listed node-0 as an owner of
// such a partition asked it for a device's readings, and node-0
// answered 200 from its old copy: 3 of the device's 6 readings (the
// failover test once read 103 of 113 readings this way). Now node-0
// refuses every read of a partition it does not serve (503
// not_serving, naming the partition), device lists included, and
// every node answers every device and the export in full.
func TestClusterHandedBackCopyIsNotRead(t *testing.T) {
	inLane(t, lanes.cluster)
	const partitions, devices, perPhase = 6, 12, 3
	nc := startNATSCluster(t, 1)
	clock := testClock()
	start := func(i int) *testNode {
		cfg := clusterNodeConfig(t, nc, i, partitions)
		cfg.Cluster.StreamReplicas = 1
		cfg.Cluster.LeaseTTL = 5 * time.Second // views refresh every 1.7 s
		return startNode(t, cfg, clock)
	}
	first := start(0)
	waitFor(t, 50*time.Millisecond, func() bool { return converged(first.main(), 2, []string{"node-0"}) })

	js := jsFor(t, nc.url(0))
	device := func(i int) string { return fmt.Sprintf("hb-%02d", i) }
	publish := func(phase int) {
		var acks []jetstream.PubAckFuture
		for i := range devices {
			for j := range perPhase {
				at := testEpoch.Add(-time.Hour + time.Duration(phase*perPhase+j)*time.Minute)
				a, err := js.PublishAsync("telemetry."+device(i), fmt.Appendf(nil, `{"ts":%d,"v":%d}`, at.UnixMilli(), phase*perPhase+j))
				require.NoError(t, err)
				acks = append(acks, a)
			}
		}
		awaitAcks(t, acks)
	}
	publish(0)
	for i := range devices {
		waitFor(t, 50*time.Millisecond, func() bool { return storedOn(t, first.main(), device(i)) == perPhase },
			"%s stored on node-0", device(i))
	}

	nodes := []*testNode{first, start(1), start(2)}
	names := []string{"node-0", "node-1", "node-2"}
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) })
	}
	publish(1)
	view := first.main().cluster.members
	byName := map[string]*testNode{}
	for _, n := range nodes {
		byName[n.cfg.Cluster.NodeName] = n
	}
	var handedBack []string
	for i := range devices {
		dev := device(i)
		owners := view.Desired(partition.Of(partitions, dev))
		for _, o := range owners {
			waitFor(t, 50*time.Millisecond, func() bool { return storedOn(t, byName[o].main(), dev) == 2*perPhase },
				"%s stored on its owner %s:%s", dev, o, copiesOf{t, nodes, dev})
		}
		if !slices.Contains(owners, "node-0") {
			handedBack = append(handedBack, dev)
		}
	}
	require.NotEmpty(t, handedBack, "node-0 hands some partitions over")

	credential, err := first.cfg.clusterCredential()
	require.NoError(t, err)
	internal := func(path, body string) (int, string) {
		return accessCall(t, http.MethodPost, first.base+path, credential, "open", body)
	}
	for _, dev := range handedBack {
		p := partition.Of(partitions, dev)
		require.Equal(t, perPhase, storedOn(t, first.main(), dev), "node-0 keeps its old copy of %s", dev)
		code, body := internal("/internal/v1/latest", fmt.Sprintf(`{"device":%q,"n":100}`, dev))
		assert.Equal(t, http.StatusServiceUnavailable, code, "node-0's old copy of %s: %s", dev, body)
		assert.Contains(t, body, `"code":"not_serving"`)
		assert.Contains(t, body, fmt.Sprintf("partition %d:", p))
		code, body = internal("/internal/v1/devices", fmt.Sprintf(`{"limit":100,"partitions":[%d]}`, p))
		assert.Equal(t, http.StatusServiceUnavailable, code, "node-0's old index of partition %d: %s", p, body)
	}

	// Through every node: every reading of every device, and the export.
	want := devices * 2 * perPhase
	for _, n := range nodes {
		for i := range devices {
			code, body := getBody(t, n.base+"/v1/devices/"+device(i)+"/readings/latest?limit=100")
			require.Equal(t, http.StatusOK, code, body)
			var l apiList
			require.NoError(t, json.Unmarshal([]byte(body), &l))
			assert.Len(t, l.Readings, 2*perPhase, "%s through %s", device(i), n.cfg.Cluster.NodeName)
		}
		q := url.Values{"prefix": {"hb-"}, "to": {fmt.Sprint(testEpoch.UnixMilli())}}
		code, body := getBody(t, n.base+"/v1/export?"+q.Encode())
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, want, strings.Count(body, `{"device":"hb-`), "export through %s", n.cfg.Cluster.NodeName)
	}

	// The old copy does not come back. A DELETE of a handed-back device
	// removes node-0's copy too; when node-0 takes the partition again
	// (an owner leaves), it resumes after what it had stored and gets
	// the rest of the other devices, and nothing of the deleted one.
	gone := handedBack[0]
	p := partition.Of(partitions, gone)
	req, err := http.NewRequest(http.MethodDelete, nodes[1].base+"/v1/devices/"+gone, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	for _, n := range nodes {
		assert.Zero(t, storedOn(t, n.main(), gone), "%s keeps a copy of the deleted device", n.cfg.Cluster.NodeName)
	}
	leaving := byName[view.Desired(p)[0]]
	leaving.close()
	var rest []*testNode
	var restNames []string
	for _, n := range nodes {
		if n != leaving {
			rest = append(rest, n)
			restNames = append(restNames, n.cfg.Cluster.NodeName)
		}
	}
	for _, n := range rest {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, restNames) })
	}
	require.True(t, first.main().cluster.node.Serves(p), "node-0 serves partition %d again", p)
	for _, dev := range handedBack {
		switch {
		case dev == gone:
			assert.Zero(t, storedOn(t, first.main(), dev), "the deleted device came back on node-0")
		case partition.Of(partitions, dev) == p:
			assert.Equal(t, 2*perPhase, storedOn(t, first.main(), dev), "node-0's copy of %s, taken again", dev)
		}
	}
	for _, n := range rest {
		code, body := getBody(t, n.base+"/v1/devices/"+gone+"/readings/latest?limit=100")
		require.Equal(t, http.StatusOK, code, body)
		var l apiList
		require.NoError(t, json.Unmarshal([]byte(body), &l))
		assert.Empty(t, l.Readings, "%s through %s", gone, n.cfg.Cluster.NodeName)
	}
}
