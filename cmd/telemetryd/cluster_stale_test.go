package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ownership"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// latestTS is the time of a device's latest reading as base answers it,
// the status, and the body when it is not 200.
func latestTS(t *testing.T, base, dev string) (time.Time, int, string) {
	t.Helper()
	code, body := getBody(t, base+"/v1/devices/"+dev+"/readings/latest?limit=1")
	if code != http.StatusOK {
		return time.Time{}, code, body
	}
	var page struct {
		Readings []struct {
			TS time.Time `json:"ts"`
		} `json:"readings"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &page), body)
	if len(page.Readings) == 0 {
		return time.Time{}, code, body
	}
	return page.Readings[0].TS, code, body
}

// TestClusterStaleOwnerStopsAnswering cuts an owner off from NATS (its
// only server stops) while the stream, on the other two servers, goes
// on acking readings of its partition. The cut-off node must not keep
// answering from its own copy, which misses them: once it trails the
// stream by more than the bound it routes the query to an owner that
// has them, or fails with a 503 naming the partition.
//
// It waits for a lease to lapse and for the JetStream cluster to settle
// after a server stops, which on a loaded machine took minutes once, so
// it runs with TELEMETRY_LONG=1 (ingest/cluster's
// TestStaleOwnerWithdrawsFromQueries covers the rule in go test):
//
//	TELEMETRY_LONG=1 go test ./cmd/telemetryd -run TestClusterStaleOwnerStopsAnswering -v
func TestClusterStaleOwnerStopsAnswering(t *testing.T) {
	inLane(t, lanes.cluster)
	if os.Getenv("TELEMETRY_LONG") == "" {
		t.Skip("set TELEMETRY_LONG=1: stops a NATS server of a three-server cluster and waits for leases to lapse")
	}
	// The servers do not tell clients of each other, so node-0 cannot
	// reconnect elsewhere.
	nc := startNATSCluster(t, 3, func(_ int, o *server.Options) { o.Cluster.NoAdvertise = true })
	clock := testClock()
	var nodes []*testNode
	var names []string
	for i := range 3 {
		cfg := clusterNodeConfig(t, nc, i, 6)
		nodes = append(nodes, startNode(t, cfg, clock))
		names = append(names, cfg.Cluster.NodeName)
	}
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) })
	}
	// A device whose partition node-0 stores.
	dev := ""
	for i := 0; dev == ""; i++ {
		d := fmt.Sprintf("stale-%03d", i)
		p := partition.Of(6, d)
		if slices.Contains(ownership.Rank(names, p)[:2], "node-0") {
			dev = d
		}
	}
	p := partition.Of(6, dev)
	base := testEpoch.Add(-time.Hour)
	js1 := jsFor(t, nc.url(1))
	publish := func(r int) {
		_, err := js1.Publish(t.Context(), "telemetry."+dev, fmt.Appendf(nil, `{"ts":%d,"temp":%d}`, base.Add(time.Duration(r)*time.Minute).UnixMilli(), r))
		require.NoError(t, err)
	}
	publish(0)
	waitFor(t, 50*time.Millisecond, func() bool {
		ts, _, _ := latestTS(t, nodes[0].base, dev)
		return ts.Equal(base)
	}, "node-0 never had the first reading")

	nc.stop(0) // node-0's only NATS server
	for r := 1; r <= 5; r++ {
		publish(r)
	}
	want := base.Add(5 * time.Minute)
	// node-0 answers from its own copy until it sees it is behind; then
	// every answer is right or names the partition.
	var answers []string
	defer func() {
		if t.Failed() {
			t.Logf("node-0's answers: %s", strings.Join(answers, "; "))
		}
	}()
	waitFor(t, 100*time.Millisecond, func() bool {
		ts, code, body := latestTS(t, nodes[0].base, dev)
		switch {
		case code == http.StatusOK && ts.Equal(want):
			return true
		case code == http.StatusServiceUnavailable:
			require.Contains(t, body, fmt.Sprintf("partition %d", p), "a 503 names the partition")
			return true
		}
		answers = append(answers, fmt.Sprintf("%d %s", code, ts.Format(time.RFC3339)))
		return false
	}, "node-0 kept answering from its stale copy")
	// The owners that are not cut off are fresh: they answer.
	for _, n := range nodes[1:] {
		ts, code, body := latestTS(t, n.base, dev)
		require.Equal(t, http.StatusOK, code, body)
		require.True(t, ts.Equal(want), "%s: latest %s, want %s", n.cfg.Cluster.NodeName, ts, want)
		// node-0 cannot withdraw from its lease; the lease lapses.
		waitFor(t, 50*time.Millisecond, func() bool { return len(n.main().cluster.members.Owners(p)) == 1 },
			"%s: node-0 still counted an owner of partition %d", n.cfg.Cluster.NodeName, p)
	}
	// And it stays so while it is cut off.
	for range 10 {
		ts, code, body := latestTS(t, nodes[0].base, dev)
		if code == http.StatusOK {
			require.True(t, ts.Equal(want), "a stale answer (latest %s, want %s)", ts, want)
		} else {
			require.Equal(t, http.StatusServiceUnavailable, code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
