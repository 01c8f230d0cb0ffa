package main

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/ingest/ownership"
)

// TestClusterStatusAgreesWithTheLeases: GET /v1/cluster on every node
// shows what the lease bucket holds: each node's URL, the partitions it
// consumes and has caught up on and its lag, each partition's desired
// owners (rendezvous ranking of the live nodes) and the nodes caught up
// on it.
func TestClusterStatusAgreesWithTheLeases(t *testing.T) {
	inLane(t, lanes.cluster)
	nc := startNATSCluster(t, 1)
	nodes := startConvergedNodes(t, nc, 3, 2, func(*Config) {})
	var names []string
	for _, n := range nodes {
		names = append(names, n.cfg.Cluster.NodeName)
	}
	js := jsFor(t, nc.url(0))
	kv, err := js.KeyValue(context.Background(), ownership.DefaultBucket)
	require.NoError(t, err)
	// A node that joins and never catches up: the owners of the
	// partitions it ranks first or second for differ from the nodes
	// caught up on them, which keep consuming them meanwhile.
	// Its lease names a partition as trailing: the status shows the
	// leases as they are.
	joiner := ownership.Lease{Node: "node-x", URL: "http://127.0.0.1:1", Ready: []int{}, Holding: []int{0, 1, 2, 3, 4, 5}, Trailing: []int{3}, Lag: 42}
	renewJoiner := func() {
		joiner.Renewed = time.Now().UTC()
		b, err := json.Marshal(joiner)
		require.NoError(t, err)
		_, err = kv.Put(context.Background(), "nodes.node-x", b)
		require.NoError(t, err)
	}
	renewJoiner()
	names = append(names, "node-x")
	leases := func() map[string]ownership.Lease {
		out := map[string]ownership.Lease{}
		for _, name := range names {
			e, err := kv.Get(context.Background(), "nodes."+name)
			require.NoError(t, err)
			var l ownership.Lease
			require.NoError(t, json.Unmarshal(e.Value(), &l))
			out[name] = l
		}
		return out
	}

	for _, n := range nodes {
		var st api.ClusterStatus
		var problem string
		// A lease is renewed every few seconds: compare once the node's
		// view has caught up with the bucket.
		waitFor(t, 100*time.Millisecond, func() bool {
			renewJoiner()
			code, body := getBody(t, n.base+"/v1/cluster")
			require.Equal(t, 200, code, body)
			st = api.ClusterStatus{}
			require.NoError(t, json.Unmarshal([]byte(body), &st))
			problem = agrees(st, leases(), names)
			return problem == ""
		}, "GET /v1/cluster on %s", n.cfg.Cluster.NodeName)
		assert.Equal(t, n.cfg.Cluster.NodeName, st.Node)
		assert.Equal(t, 6, st.Partitions)
		assert.Equal(t, 2, st.Copies)
		joined := 0
		for _, po := range st.Layout {
			assert.NotContains(t, po.CaughtUp, "node-x")
			assert.Len(t, po.CaughtUp, 2, "partition %d is answered by two nodes", po.Partition)
			if slices.Contains(po.Owners, "node-x") {
				joined++
			}
		}
		assert.NotZero(t, joined, "node-x ranks among the owners of some partitions")
		i := slices.IndexFunc(st.Nodes, func(cn api.ClusterNode) bool { return cn.Node == "node-x" })
		require.GreaterOrEqual(t, i, 0)
		assert.Equal(t, uint64(42), st.Nodes[i].Lag)
		assert.Equal(t, []int{3}, st.Nodes[i].Trailing)
	}
}

// agrees compares a status with the leases; "" when they agree.
func agrees(st api.ClusterStatus, leases map[string]ownership.Lease, names []string) string {
	if len(st.Nodes) != len(names) {
		return "node count"
	}
	for _, cn := range st.Nodes {
		l, ok := leases[cn.Node]
		if !ok {
			return "unknown node " + cn.Node
		}
		if cn.URL != l.URL || !slices.Equal(cn.Ready, l.Ready) || !slices.Equal(cn.Holding, l.Holding) || cn.Lag != l.Lag ||
			!slices.Equal(cn.Trailing, orEmpty(l.Trailing)) {
			return "node " + cn.Node + " differs from its lease"
		}
	}
	if len(st.Layout) != st.Partitions {
		return "layout length"
	}
	for p, po := range st.Layout {
		if po.Partition != p || !slices.Equal(po.Owners, ownership.Rank(names, p)[:st.Copies]) {
			return "owners of a partition"
		}
		var caught []string
		for _, name := range names {
			if slices.Contains(leases[name].Ready, p) {
				caught = append(caught, name)
			}
		}
		slices.Sort(caught)
		if !slices.Equal(po.CaughtUp, caught) {
			return "caught-up nodes of a partition"
		}
	}
	return ""
}
