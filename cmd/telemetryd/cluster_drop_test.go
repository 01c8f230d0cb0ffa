package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// tableDays lists the days node m holds in its own store.
func tableDays(t *testing.T, m *Main) []string {
	t.Helper()
	ts, err := m.store.Tables(context.Background())
	require.NoError(t, err)
	var out []string
	for _, x := range ts {
		out = append(out, x.Day.String())
	}
	return out
}

// TestClusterDeleteReachesANodeThatWasDown: DELETE /v1/tables/{day}
// while a node is down. When it is back it drops the day too; a node
// that joins afterwards and replays the stream does not write the day
// again; the other day is untouched everywhere.
func TestClusterDeleteReachesANodeThatWasDown(t *testing.T) {
	inLane(t, lanes.cluster)
	const partitions, devices = 4, 8
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
	old, today := testEpoch.Add(-48*time.Hour), testEpoch.Add(-time.Hour)
	oldDay, todayDay := old.Format(time.DateOnly), today.Format(time.DateOnly)
	for i := range devices {
		for _, at := range []time.Time{old, today} {
			_, err := js.Publish(context.Background(), fmt.Sprintf("telemetry.drop-%d", i), fmt.Appendf(nil, `{"ts":%d,"v":1}`, at.UnixMilli()))
			require.NoError(t, err)
		}
	}
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool {
			return slices.Equal(tableDays(t, n.main()), []string{oldDay, todayDay})
		}, "%s stores both days", n.cfg.Cluster.NodeName)
	}

	down := nodes[2]
	down.close()
	for _, n := range nodes[:2] {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names[:2]) })
	}
	req, err := http.NewRequest(http.MethodDelete, nodes[0].base+"/v1/tables/"+oldDay, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	for _, n := range nodes[:2] {
		assert.Equal(t, []string{todayDay}, tableDays(t, n.main()))
	}

	// Back: it drops the day it missed.
	down.open(clock)
	waitFor(t, 50*time.Millisecond, func() bool {
		return slices.Equal(tableDays(t, down.main()), []string{todayDay})
	}, "the node that was down still holds the dropped day")
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) })
	}

	// A new node replays the stream from its start for its partitions:
	// the dropped day is not written again, the other day is.
	cfg := clusterNodeConfig(t, nc, 3, partitions)
	cfg.Cluster.LeaseTTL = 3 * time.Second
	joiner := startNode(t, cfg, clock)
	all := append(slices.Clone(names), cfg.Cluster.NodeName)
	nodes = append(nodes, joiner)
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, all) })
	}
	assert.Equal(t, []string{todayDay}, tableDays(t, joiner.main()), "the joining node wrote the dropped day again")
	owned := 0
	for i := range devices {
		rs, err := joiner.main().store.Latest(context.Background(), buckets.DeviceID(fmt.Sprintf("drop-%d", i)), 10)
		require.NoError(t, err)
		owned += len(rs)
	}
	assert.Positive(t, owned, "the joining node stores today's readings of its partitions")
	for _, n := range nodes {
		code, body := getBody(t, n.base+"/v1/tables")
		require.Equal(t, http.StatusOK, code)
		assert.NotContains(t, body, oldDay, "through %s", n.cfg.Cluster.NodeName)
		assert.Contains(t, body, todayDay, "through %s", n.cfg.Cluster.NodeName)
	}
}
