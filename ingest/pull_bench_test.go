package ingest

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/ingesttest"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// countWriter counts the readings written and keeps nothing.
type countWriter struct{ n atomic.Int64 }

func (w *countWriter) Write(_ context.Context, rs []buckets.Reading) error {
	w.n.Add(int64(len(rs)))
	return nil
}

func (w *countWriter) Assign(context.Context, []buckets.Assignment) error { return nil }

// BenchmarkCaughtUpPartitions publishes messages of one reading from
// 1,000 devices (4,096 awaiting their acks) into 8 partition streams
// while their 8 ingesters, on one connection as in the service, keep up
// with a writer that returns at once: the cost of delivering to
// caught-up consumers, pulled every PullEvery (pull) or pushed as each
// message is stored (push). cpu-us/msg is the process's CPU (server,
// ingesters and publisher) per message.
func BenchmarkCaughtUpPartitions(b *testing.B) {
	const partitions = 8
	for _, mode := range []struct {
		name  string
		every time.Duration
	}{{"pull", 0}, {"push", -1}} {
		b.Run(mode.name, func(b *testing.B) {
			srv := runServer(b, b.TempDir(), -1)
			src, dst := partition.Mapping(DefaultSubjectPrefix, partitions)
			require.NoError(b, srv.GlobalAccount().AddMapping(src, dst))
			nc, err := nats.Connect(srv.ClientURL())
			require.NoError(b, err)
			defer nc.Close()
			w := &countWriter{}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{}, partitions)
			defer func() {
				cancel()
				for range partitions {
					<-done
				}
			}()
			var ins []*Ingester
			for p := range partitions {
				cfg := partitionedConfig(partitions, p)
				cfg.PartitionStreams, cfg.PullEvery = true, mode.every
				cfg.Consumer = "ingest"
				cfg.Logger = slog.New(slog.DiscardHandler)
				in, err := New(nc, w, cfg)
				require.NoError(b, err)
				ins = append(ins, in)
				go func() {
					defer func() { done <- struct{}{} }()
					_ = in.Run(ctx)
				}()
			}
			require.Eventually(b, func() bool {
				for _, in := range ins {
					if in.Ready() != nil {
						return false
					}
				}
				return true
			}, 10*time.Second, 10*time.Millisecond)

			pnc, err := nats.Connect(srv.ClientURL())
			require.NoError(b, err)
			defer pnc.Close()
			js, err := jetstream.New(pnc, jetstream.WithPublishAsyncMaxPending(4096))
			require.NoError(b, err)
			subjects := make([]string, 1000)
			for i := range subjects {
				subjects[i] = "telemetry.dev-" + strconv.Itoa(i)
			}
			ms := nowMillis()
			var buf []byte
			cpu0 := ingesttest.ProcessCPU()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				buf = append(buf[:0], `{"ts":`...)
				buf = strconv.AppendInt(buf, ms+int64(i/len(subjects)), 10)
				buf = append(buf, `,"temp":21.5,"hum":40,"ok":true}`...)
				_, err := js.PublishAsync(subjects[i%len(subjects)], append([]byte(nil), buf...),
					jetstream.WithStallWait(time.Minute))
				require.NoError(b, err)
			}
			deadline := time.Now().Add(2 * time.Minute)
			for w.n.Load() < int64(b.N) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			b.StopTimer()
			require.Equal(b, int64(b.N), w.n.Load(), "readings written")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(ingesttest.ProcessCPU()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/msg")
		})
	}
}
