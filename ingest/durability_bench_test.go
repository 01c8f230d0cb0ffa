package ingest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
)

// BenchmarkJetStreamDurability publishes one small message per op into a
// file stream, 256 publishes awaiting their acks at once, on one server
// (R1) and on a three-server cluster of this process (R3), with and
// without fsync of every write (sync_interval: always): what JetStream
// alone allows a door of one reading per message in each durability
// mode. An R3 stream under SyncAlways stores through its Raft log, which
// fsyncs once per append entry (many proposals), not per message.
func BenchmarkJetStreamDurability(b *testing.B) {
	for _, replicas := range []int{1, 3} {
		for _, sync := range []bool{false, true} {
			b.Run(fmt.Sprintf("R%d/sync=%v", replicas, sync), func(b *testing.B) {
				urls := runJetStream(b, replicas, sync)
				nc, err := nats.Connect(urls[0])
				require.NoError(b, err)
				defer nc.Close()
				js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
				require.NoError(b, err)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.*"},
					Storage: jetstream.FileStorage, Replicas: replicas})
				require.NoError(b, err)
				payload := []byte(`{"ts":1764000000000,"temp":21.5}`)
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					_, err := js.PublishAsync(fmt.Sprintf("bench.d%d", i%1000), payload, jetstream.WithStallWait(10*time.Second))
					require.NoError(b, err)
				}
				select {
				case <-js.PublishAsyncComplete():
				case <-time.After(time.Minute):
					b.Fatal("acks did not arrive")
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}

// runJetStream starts n JetStream servers (a cluster when n > 1) with
// SyncAlways set to sync and returns their client URLs once the
// cluster has a meta leader.
func runJetStream(b *testing.B, n int, sync bool) []string {
	b.Helper()
	if n == 1 {
		return []string{ingesttest.RunNATS(b, func(o *server.Options) { o.SyncAlways = sync }).ClientURL()}
	}
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		ports[i] = l.Addr().(*net.TCPAddr).Port
		require.NoError(b, l.Close())
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	var urls []string
	var srvs []*server.Server
	for i := range n {
		srv := ingesttest.RunNATS(b, func(o *server.Options) {
			o.ServerName, o.SyncAlways = fmt.Sprintf("s%d", i), sync
			o.Cluster = server.ClusterOpts{Name: "bench", Host: "127.0.0.1", Port: ports[i]}
			o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		})
		srvs = append(srvs, srv)
		urls = append(urls, srv.ClientURL())
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range srvs {
			if s.JetStreamIsLeader() {
				return urls
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatal("no JetStream meta leader")
	return nil
}
