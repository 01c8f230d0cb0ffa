package main

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClusterMQTT: devices publish MQTT QoS 1 on telemetry/<device>
// through the MQTT listeners of the NATS cluster's servers (a cluster
// node has no MQTT listener of its own). Every PUBACKed reading is
// stored on both copies of its partition exactly once and read through
// every node, judged by the crash loop's checker.
func TestClusterMQTT(t *testing.T) {
	inLane(t, lanes.cluster)
	const partitions, devices, rounds = 12, 30, 20
	mqttAddrs := make([]string, 3)
	nc := startNATSCluster(t, 3, func(i int, o *server.Options) {
		port := freePort(t)
		o.MQTT.Host, o.MQTT.Port = "127.0.0.1", port
		mqttAddrs[i] = "127.0.0.1:" + strconv.Itoa(port)
	})
	clock := testClock()
	var nodes []*testNode
	var names []string
	for i := range 3 {
		cfg := clusterNodeConfig(t, nc, i, partitions)
		nodes = append(nodes, startNode(t, cfg, clock))
		names = append(names, cfg.Cluster.NodeName)
	}
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) })
	}

	var clients []mqtt.Client
	for i, addr := range mqttAddrs {
		opts := mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(fmt.Sprintf("gateway-%d", i)).
			SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(10 * time.Second)
		c := mqtt.NewClient(opts)
		tok := c.Connect()
		require.True(t, tok.WaitTimeout(30*time.Second), "MQTT connect to %s timed out", addr)
		require.NoError(t, tok.Error())
		t.Cleanup(func() { c.Disconnect(100) })
		clients = append(clients, c)
	}
	p := &loadPublisher{log: &ackedLog{acked: map[string][]int{}}, prefix: "mqtt", devices: devices, start: testEpoch.Add(-time.Hour)}
	for r := range rounds {
		toks := make([]mqtt.Token, devices)
		for i := range devices {
			ts := p.start.Add(time.Duration(r) * time.Second).UnixMilli()
			toks[i] = clients[(r+i)%len(clients)].Publish("telemetry/"+p.device(i), 1, false, fmt.Appendf(nil, `{"ts":%d,"n":%d}`, ts, r))
		}
		for i, tok := range toks {
			if tok.WaitTimeout(10*time.Second) && tok.Error() == nil {
				p.log.add(p.device(i), r) // PUBACKed
			}
		}
	}
	p.rounds.Store(rounds)
	tally := checkCopies(t, nodes, p, partitions, 30*time.Second)
	assert.Equal(t, 2*devices*rounds, tally.Acked, "every publish was PUBACKed (counted once per copy)")
	t.Logf("MQTT through the cluster, both copies: %s", tally)
}
