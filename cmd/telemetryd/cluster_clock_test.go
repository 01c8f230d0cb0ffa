package main

import (
	"testing"
	"time"
)

// TestClusterClockOffset runs three nodes whose clocks are a minute
// ahead, a minute behind and right. They agree on the live nodes and
// the owners (a lease's age is taken on the servers' clock), and when
// one stops the others take its partitions over. A node a minute ahead
// used to see every other lease as dead, and claim every partition.
func TestClusterClockOffset(t *testing.T) {
	inLane(t, lanes.cluster)
	nc := startNATSCluster(t, 3)
	offsets := []time.Duration{time.Minute, -time.Minute, 0}
	var nodes []*testNode
	var names []string
	for i, off := range offsets {
		cfg := clusterNodeConfig(t, nc, i, 6)
		cfg.Cluster.LeaseTTL = 3 * time.Second
		nodes = append(nodes, startNode(t, cfg, func() time.Time { return time.Now().Add(off) }))
		names = append(names, cfg.Cluster.NodeName)
	}
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) },
			"%s never agreed on the owners", n.cfg.Cluster.NodeName)
	}
	nodes[2].crash()
	for _, n := range nodes[:2] {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names[:2]) },
			"%s never took over the stopped node's partitions", n.cfg.Cluster.NodeName)
	}
}
