package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
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
	cpu := func() time.Duration {
		var ru syscall.Rusage
		require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	// drained reports whether every consumer of every node has
	// nothing pending or unacked: everything published is stored.
	drained := func(ms []*Main) bool {
		for _, m := range ms {
			var ings []interface {
				Backlog(context.Context) (uint64, bool, error)
			}
			if m.cluster == nil {
				for _, in := range m.ingest {
					ings = append(ings, in)
				}
			} else {
				for _, c := range m.cluster.node.Consumers() {
					ings = append(ings, c)
				}
			}
			for _, in := range ings {
				pending, _, err := in.Backlog(context.Background())
				if err != nil || pending > 0 {
					return false
				}
			}
		}
		return true
	}
	var cpuEnd time.Duration
	wait := func(ms []*Main, want int) time.Duration {
		start := time.Now()
		waitFor(t, 100*time.Millisecond, func() bool { return drained(ms) })
		d := time.Since(start)
		cpuEnd = cpu()
		require.Equal(t, want, stored(ms), "every copy stored")
		return d
	}

	// One node.
	single := newTestConfig(t)
	ref := startService(t, single)
	cpu0 := cpu()
	start := time.Now()
	publish([]jetstream.JetStream{ref.js})
	pub := time.Since(start)
	one := pub + wait([]*Main{ref.Main}, total)
	t.Logf("1 node: %d readings in %s = %.0f readings/s (publish alone %s); %.1f CPU s per M readings (NATS, service and publisher)",
		total, one.Round(time.Millisecond), float64(total)/one.Seconds(), pub.Round(time.Millisecond), (cpuEnd-cpu0).Seconds()*1e6/float64(total))
	ref.stop(t)

	for _, copies := range []int{2, 1, 2, 1} {
		nc := startNATSCluster(t, 3)
		clock := testClock()
		var ms []*Main
		var nodes []*testNode
		var names []string
		for i := range 3 {
			cfg := clusterNodeConfig(t, nc, i, 12)
			cfg.Cluster.Copies = copies
			cfg.Cluster.LeaseTTL = 20 * time.Second // the whole cluster shares two cores here: keep leases from lapsing under that load
			n := startNode(t, cfg, clock)
			nodes = append(nodes, n)
			ms = append(ms, n.main())
			names = append(names, cfg.Cluster.NodeName)
		}
		for _, m := range ms {
			waitFor(t, 50*time.Millisecond, func() bool { return converged(m, copies, names) })
		}
		start, cpu0 := time.Now(), cpu()
		publish([]jetstream.JetStream{jsFor(t, nc.url(0)), jsFor(t, nc.url(1)), jsFor(t, nc.url(2))})
		pub := time.Since(start)
		d := pub + wait(ms, total*copies)
		t.Logf("3 nodes, R3 stream, %d copies: %d readings (%d stored) in %s = %.0f readings/s (%.2f x one node; publish alone %s); %.1f CPU s per M readings",
			copies, total, total*copies, d.Round(time.Millisecond), float64(total)/d.Seconds(), one.Seconds()/d.Seconds(),
			pub.Round(time.Millisecond), (cpuEnd-cpu0).Seconds()*1e6/float64(total))
		for _, n := range nodes {
			n.close()
		}
		for i := range nc.servers {
			nc.stop(i)
		}
	}
}

// benchDevice is the device of the throughput measurement.
func benchDevice(i int) buckets.DeviceID { return buckets.DeviceID(fmt.Sprintf("bench-%04d", i)) }
