package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// TestClusterDeleteDevice: DELETE /v1/devices/{device} through one node
// while another is down. The device's readings, record and attributes
// go on every node, the one that was down included when it is back; a
// node that joins afterwards and replays the stream from its start for
// its partitions does not write them again; what the device publishes
// after the delete is stored; every other device's answers through
// every node are byte-for-byte what they were.
func TestClusterDeleteDevice(t *testing.T) {
	inLane(t, lanes.cluster)
	const partitions, devices, perDevice = 4, 8, 10
	nc := startNATSCluster(t, 1)
	clock := testClock()
	var nodes []*testNode
	var names []string
	for i := range 3 {
		cfg := clusterNodeConfig(t, nc, i, partitions)
		cfg.Cluster.LeaseTTL = 3 * time.Second // views refresh every second
		nodes = append(nodes, startNode(t, cfg, clock))
		names = append(names, cfg.Cluster.NodeName)
	}
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) })
	}
	js := jsFor(t, nc.url(0))
	device := func(i int) string { return fmt.Sprintf("del-%d", i) }
	const gone = "del-3"
	today := testEpoch.Truncate(24 * time.Hour)
	for i := range devices {
		for j := range perDevice {
			at := today.Add(-6*time.Hour + time.Duration(j)*time.Hour) // yesterday and today
			_, err := js.Publish(context.Background(), "telemetry."+device(i),
				[]byte(attrMsg(at, i*100+j, fmt.Sprintf(`{"fleet":"East","unit":"u%d"}`, i))))
			require.NoError(t, err)
		}
	}
	// stored counts dev's readings on the owners of its partition, as
	// a live node reads the leases. A sum over every node never settled
	// when a lease lapsed on a loaded machine: a third node consumed the
	// partition until the lease was back, and keeps that copy (never
	// read again; a delete removes it too).
	owners := func(dev string) []string {
		for _, n := range nodes {
			if m := n.main(); m != nil {
				return m.cluster.members.Desired(partition.Of(partitions, dev))
			}
		}
		return nil
	}
	stored := func(dev string) int {
		total := 0
		for _, n := range nodes {
			if m := n.main(); m != nil && slices.Contains(owners(dev), n.cfg.Cluster.NodeName) {
				total += storedOn(t, m, dev)
			}
		}
		return total
	}
	for i := range devices {
		waitFor(t, 50*time.Millisecond, func() bool { return stored(device(i)) == 2*perDevice },
			"%s stored on its two owners:%s", device(i), copiesOf{t, nodes, device(i)})
	}
	var others []string
	for i := range devices {
		if device(i) != gone {
			others = append(others, keptPaths(device(i))...)
		}
	}
	before := answersOf(t, nodes[0].base, others)

	// One of the device's owners is down during the delete.
	var down *testNode
	var live []*testNode
	var liveNames []string
	for i, n := range nodes {
		if down == nil && slices.Contains(owners(gone), names[i]) {
			down = n
			continue
		}
		live = append(live, n)
		liveNames = append(liveNames, names[i])
	}
	down.close()
	for _, n := range live {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, liveNames) })
	}
	req, err := http.NewRequest(http.MethodDelete, live[0].base+"/v1/devices/"+gone, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	goneLocally := func(m *Main) bool {
		_, err := m.store.Device(context.Background(), gone)
		return storedOn(t, m, gone) == 0 && errors.Is(err, buckets.ErrNotFound)
	}
	for _, n := range live {
		assert.True(t, goneLocally(n.main()), "%s still holds the device", n.cfg.Cluster.NodeName)
	}

	// Back: it deletes the device it missed.
	down.open(clock)
	waitFor(t, 50*time.Millisecond, func() bool { return goneLocally(down.main()) },
		"the node that was down still holds the deleted device")
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) })
	}

	// Published after the delete: stored.
	_, err = js.Publish(context.Background(), "telemetry."+gone, fmt.Appendf(nil, `{"ts":%d,"v":7}`, testEpoch.Add(-30*time.Minute).UnixMilli()))
	require.NoError(t, err)
	waitFor(t, 50*time.Millisecond, func() bool { return stored(gone) == 2 }, "the reading after the delete on two owners")

	// A new node replays the stream from its start for its partitions.
	cfg := clusterNodeConfig(t, nc, 3, partitions)
	cfg.Cluster.LeaseTTL = 3 * time.Second
	joiner := startNode(t, cfg, clock)
	all := append(slices.Clone(names), cfg.Cluster.NodeName)
	nodes = append(nodes, joiner)
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, all) })
	}
	for _, n := range nodes {
		m := n.main()
		assert.LessOrEqual(t, storedOn(t, m, gone), 1, "%s wrote readings from before the delete", n.cfg.Cluster.NodeName)
		if di, err := m.store.Device(context.Background(), gone); err == nil {
			assert.Empty(t, di.Attributes, "%s wrote attributes from before the delete", n.cfg.Cluster.NodeName)
		}
	}
	from := url.QueryEscape(testEpoch.AddDate(0, 0, -3).Format(time.RFC3339))
	for _, n := range nodes {
		code, body := getBody(t, n.base+"/v1/devices/"+gone+"/readings?order=asc&limit=1000&from="+from)
		require.Equal(t, http.StatusOK, code, body)
		var l apiList
		require.NoError(t, json.Unmarshal([]byte(body), &l))
		require.Len(t, l.Readings, 1, "through %s", n.cfg.Cluster.NodeName)
		assert.EqualValues(t, 7, l.Readings[0].Values["v"])
		code, attrs := deviceAttrs(t, n.base, gone)
		assert.Equal(t, http.StatusOK, code)
		assert.Empty(t, attrs, "through %s", n.cfg.Cluster.NodeName)
		_, body = getBody(t, n.base+"/api/v1/label/unit/values")
		assert.NotContains(t, body, `"u3"`, "through %s", n.cfg.Cluster.NodeName)
		assert.Equal(t, before, answersOf(t, n.base, others), "other devices through %s", n.cfg.Cluster.NodeName)
	}
}
