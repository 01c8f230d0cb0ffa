package main

import (
	"net/http"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/cluster"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// trailingView is a node's view of the cluster while the consumer of
// one owner of partition p trails the stream: that owner has withdrawn
// p from the caught-up partitions it publishes, and its lease still
// holds p.
type trailingView struct {
	cluster.Membership
	p        int
	trailing string
}

func (v trailingView) Owners(p int) []cluster.Peer {
	out := v.Membership.Owners(p)
	if p == v.p {
		out = slices.DeleteFunc(out, func(o cluster.Peer) bool { return o.Node == v.trailing })
	}
	return out
}

// TestClusterAttributesReachAnOwnerThatTrails: a PUT of a device's
// attributes through node A, while owner X of the device's partition
// trails its stream (A sees only the other owner Y caught up), reaches
// X all the same: a PATCH through X right after answers the PUT's
// attributes with its own, and both owners keep them.
func TestClusterAttributesReachAnOwnerThatTrails(t *testing.T) {
	inLane(t, lanes.cluster)
	nc := startNATSCluster(t, 1)
	nodes := startConvergedNodes(t, nc, 3, 2, func(*Config) {})
	const dev = "truck_07"
	byName := map[string]*testNode{}
	for _, n := range nodes {
		byName[n.cfg.Cluster.NodeName] = n
	}
	members := nodes[0].main().cluster.members
	p := partition.Of(members.Partitions(), dev)
	owners := members.Owners(p)
	require.Len(t, owners, 2)
	x, y := byName[owners[0].Node], byName[owners[1].Node]
	var a *testNode // the node that does not own the device
	for _, n := range nodes {
		if n != x && n != y {
			a = n
		}
	}

	ma := a.main()
	credential, err := a.cfg.clusterCredential()
	require.NoError(t, err)
	routerA, err := cluster.New(cluster.Config{Local: ma.store, Credential: credential, Logger: ma.log,
		Membership: trailingView{Membership: membershipView{ma.cluster.members}, p: p, trailing: x.cfg.Cluster.NodeName}})
	require.NoError(t, err)
	put := buckets.Assignment{Device: dev, At: buckets.MustTicks(ma.now()), Replace: true,
		Set: buckets.Attributes{{Name: "fleet", Value: "East"}, {Name: "tmp", Value: "x"}}}
	require.NoError(t, routerA.Assign(t.Context(), []buckets.Assignment{put}), "the PUT through %s", a.cfg.Cluster.NodeName)

	code, body := sendJSON(t, http.MethodPatch, x.base+"/v1/devices/"+dev+"/attributes", `{"model":"F-150","tmp":null}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.JSONEq(t, `{"device":"`+dev+`","attributes":{"fleet":"East","model":"F-150"}}`, body, "the PATCH through the owner that trailed")
	for _, n := range []*testNode{x, y} {
		d, err := n.main().store.Device(t.Context(), dev)
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"fleet": "East", "model": "F-150"}, d.Attributes.Map(), "the copy of %s", n.cfg.Cluster.NodeName)
	}
}
