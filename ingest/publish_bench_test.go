package ingest

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
)

// BenchmarkPublishSynced publishes a line protocol write's messages (one
// per device) into a stream on a server that fsyncs every write, message
// by message and as one atomic batch: ns/op is one write.
func BenchmarkPublishSynced(b *testing.B) {
	for _, n := range []int{2, 10, 50, 200, 1000} {
		for _, atomic := range []bool{false, true} {
			b.Run(fmt.Sprintf("messages=%d/atomic=%v", n, atomic), func(b *testing.B) {
				dir := b.TempDir()
				srv := ingesttest.RunNATS(b, func(o *server.Options) { o.StoreDir, o.SyncAlways = dir, true })
				nc, err := nats.Connect(srv.ClientURL())
				require.NoError(b, err)
				defer nc.Close()
				js, err := jetstream.New(nc)
				require.NoError(b, err)
				cfg := Config{AtomicPublish: true}
				_, err = EnsureStream(context.Background(), js, cfg, nil)
				require.NoError(b, err)
				cfg.AtomicPublish = atomic
				p, err := NewPublisher(nc, cfg)
				require.NoError(b, err)
				msgs := readingMsgs(n)
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					require.NoError(b, p.Publish(context.Background(), msgs))
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/message")
			})
		}
	}
}
