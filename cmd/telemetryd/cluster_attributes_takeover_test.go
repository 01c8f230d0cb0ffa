package main

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// TestClusterAttributesReachATakeoverOwner: attributes set over HTTP
// are not in the stream, so a node that takes a partition over and
// replays the stream would not have them, and its fleet lists would be
// silently partial. Three nodes, every partition on two; each truck's
// readings carry fleet West, then a PUT over HTTP sets fleet East and a
// tag, and a PATCH removes the tag. One node stops: the node taking
// each of its partitions over copies the partition's attributes from
// the remaining owner before it answers, so its own store and the fleet
// lists it answers have every truck as East, without the tag.
func TestClusterAttributesReachATakeoverOwner(t *testing.T) {
	inLane(t, lanes.cluster)
	f := attrFleet{n: 24}
	nc := startNATSCluster(t, 1)
	nodes := startConvergedNodes(t, nc, 3, 2, func(*Config) {})
	js := jsFor(t, nc.url(0))
	f.storeOnOwners(t, js, nodes, `,"attributes":{"fleet":"West"}`)
	for i := range f.n {
		code, body := sendJSON(t, http.MethodPut, nodes[i%3].base+"/v1/devices/"+f.device(i)+"/attributes", `{"fleet":"East","tag":"x"}`)
		require.Equal(t, http.StatusOK, code, body)
		code, body = sendJSON(t, http.MethodPatch, nodes[(i+1)%3].base+"/v1/devices/"+f.device(i)+"/attributes", `{"tag":null}`)
		require.Equal(t, http.StatusOK, code, body)
	}

	victim := nodes[1]
	members := nodes[0].main().cluster.members
	var names []string
	for _, n := range nodes {
		names = append(names, n.cfg.Cluster.NodeName)
	}
	// The trucks of the victim's partitions, and who takes each over.
	takers := map[string]*testNode{}
	for i := range f.n {
		p := partition.Of(members.Partitions(), f.device(i))
		owners := members.Desired(p)
		if !slices.Contains(owners, victim.cfg.Cluster.NodeName) {
			continue
		}
		for _, n := range nodes {
			if !slices.Contains(owners, n.cfg.Cluster.NodeName) {
				takers[f.device(i)] = n
			}
		}
	}
	require.NotEmpty(t, takers, "the victim owns no truck")
	victim.close()
	survivors := []*testNode{nodes[0], nodes[2]}
	for _, n := range survivors {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, []string{names[0], names[2]}) },
			"%s never saw every partition on both survivors", n.cfg.Cluster.NodeName)
	}

	for dev, n := range takers {
		d, err := n.main().store.Device(t.Context(), buckets.DeviceID(dev))
		require.NoError(t, err, "%s on %s", dev, n.cfg.Cluster.NodeName)
		assert.Equal(t, map[string]string{"fleet": "East"}, d.Attributes.Map(), "%s on %s, which took it over", dev, n.cfg.Cluster.NodeName)
	}
	var want []string
	for i := range f.n {
		want = append(want, f.device(i))
	}
	for _, n := range survivors {
		code, body := getBody(t, n.base+"/v1/devices?limit=100&match="+url.QueryEscape(`{fleet="East"}`))
		require.Equal(t, http.StatusOK, code, body)
		var v struct {
			Devices []struct {
				Device     string            `json:"device"`
				Attributes map[string]string `json:"attributes"`
			} `json:"devices"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &v))
		var got []string
		for _, d := range v.Devices {
			got = append(got, d.Device)
			assert.Equal(t, map[string]string{"fleet": "East"}, d.Attributes, "%s via %s", d.Device, n.cfg.Cluster.NodeName)
		}
		assert.Equal(t, want, got, "the East fleet via %s", n.cfg.Cluster.NodeName)
	}
}
