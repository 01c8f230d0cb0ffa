package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// TestClusterIngestThroughput measures end-to-end ingest (publish to
// stored on every copy) of one node against a three-node cluster on
// this machine, with one and with two copies. It is a measurement, not
// a check: run it with
//
//	TELEMETRY_CLUSTER_BENCH=1 go test ./cmd/telemetryd -run TestClusterIngestThroughput -v
func TestClusterIngestThroughput(t *testing.T) {
	if os.Getenv("TELEMETRY_CLUSTER_BENCH") == "" {
		t.Skip("set TELEMETRY_CLUSTER_BENCH=1 to measure")
	}
	const devices, msgs, perMsg = 1000, 20, 10 // 200,000 readings
	total := devices * msgs * perMsg
	payload := func(i, m int) []byte {
		var b strings.Builder
		b.WriteByte('[')
		for r := range perMsg {
			if r > 0 {
				b.WriteByte(',')
			}
			ts := testEpoch.Add(-3 * time.Hour).Add(time.Duration(m*perMsg+r) * time.Second).UnixMilli()
			fmt.Fprintf(&b, `{"ts":%d,"temp":%d.25,"rh":%d,"ok":true}`, ts, (i+r)%40, (m+r)%100)
		}
		b.WriteByte(']')
		return []byte(b.String())
	}
	publish := func(conns []jetstream.JetStream) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var acks []jetstream.PubAckFuture
		settle := func() {
			for _, a := range acks {
				select {
				case <-a.Ok():
				case err := <-a.Err():
					require.NoError(t, err)
				case <-ctx.Done():
					t.Fatal("acks")
				}
			}
			acks = acks[:0]
		}
		for m := range msgs {
			for i := range devices {
				a, err := conns[(i+m)%len(conns)].PublishAsync(fmt.Sprintf("telemetry.bench-%04d", i), payload(i, m))
				require.NoError(t, err)
				acks = append(acks, a)
			}
			settle() // a window of one message per device
		}
	}
	// stored counts the readings in every store (copies included).
	stored := func(ms []*Main) int {
		n := 0
		for _, m := range ms {
			for i := range devices {
				rs, err := m.store.Latest(context.Background(), benchDevice(i), msgs*perMsg)
				require.NoError(t, err)
				n += len(rs)
			}
		}
		return n
	}
	wait := func(ms []*Main, want int) time.Duration {
		start := time.Now()
		require.Eventually(t, func() bool { return stored(ms) >= want }, 10*time.Minute, 500*time.Millisecond)
		return time.Since(start)
	}

	// One node.
	single := newTestConfig(t)
	ref := startService(t, single)
	start := time.Now()
	publish([]jetstream.JetStream{ref.js})
	wait([]*Main{ref.Main}, total)
	one := time.Since(start)
	t.Logf("1 node: %d readings in %s = %.0f readings/s", total, one.Round(time.Millisecond), float64(total)/one.Seconds())
	ref.stop(t)

	for _, copies := range []int{1, 2} {
		nc := startNATSCluster(t, 3)
		clock := testClock()
		var ms []*Main
		var names []string
		for i := range 3 {
			cfg := clusterNodeConfig(t, nc, i, 12)
			cfg.Cluster.Copies = copies
			cfg.Cluster.LeaseTTL = 5 * time.Second
			n := startNode(t, cfg, clock)
			ms = append(ms, n.main())
			names = append(names, cfg.Cluster.NodeName)
		}
		for _, m := range ms {
			require.Eventually(t, func() bool { return converged(m, copies, names) }, time.Minute, 50*time.Millisecond)
		}
		start := time.Now()
		publish([]jetstream.JetStream{jsFor(t, nc.url(0)), jsFor(t, nc.url(1)), jsFor(t, nc.url(2))})
		wait(ms, total*copies)
		d := time.Since(start)
		t.Logf("3 nodes, R3 stream, %d copies: %d readings (%d stored) in %s = %.0f readings/s (%.2f x one node)",
			copies, total, total*copies, d.Round(time.Millisecond), float64(total)/d.Seconds(), one.Seconds()/d.Seconds())
	}
}

// benchDevice is the device of the throughput measurement.
func benchDevice(i int) buckets.DeviceID { return buckets.DeviceID(fmt.Sprintf("bench-%04d", i)) }
