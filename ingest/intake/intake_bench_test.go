package intake

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
)

// BenchmarkIntakeBatchSize publishes messages of 1 and 100 readings
// (JSON of about 54 bytes each) from 1,000 devices, up to 16,384 and
// 48 MiB awaiting their acks, through the intake into partition
// streams that fsync every write, with atomic batches of at most max
// messages (the server's bound raised to it): whether the server's cost
// of staging a batch grows faster than the batch. The process's CPU
// (server, intake and publisher) per message is reported as
// cpu-us/msg.
func BenchmarkIntakeBatchSize(b *testing.B) {
	for _, readings := range []int{1, 100} {
		payload := benchPayload(readings)
		for _, maxBatch := range []int{50, 100, 250, 500, 1000, 2000, 4000} {
			b.Run(fmt.Sprintf("readings=%d/max=%d", readings, maxBatch), func(b *testing.B) {
				// Past the server's default bound of a batch (1,000).
				srv, _ := newTestServer(b, func(o *server.Options) { o.JetStreamLimits.MaxBatchSize = max(maxBatch, 1000) })
				in := startTestIntake(b, srv, Config{MaxBatch: maxBatch, Linger: time.Millisecond}, nil)
				nc, err := nats.Connect(srv.ClientURL())
				require.NoError(b, err)
				defer nc.Close()
				// As the end-to-end bench: at most 48 MiB awaiting acks,
				// which the partitions' queues hold.
				dev, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(min(1<<14, 48<<20/len(payload))))
				require.NoError(b, err)
				subjects := make([]string, 1000)
				for i := range subjects {
					subjects[i] = "telemetry.dev-" + strconv.Itoa(i)
				}
				cpu0 := ingesttest.ProcessCPU()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					_, err := dev.PublishAsync(subjects[i%len(subjects)], payload, jetstream.WithStallWait(time.Minute))
					require.NoError(b, err)
				}
				select {
				case <-dev.PublishAsyncComplete():
				case <-time.After(2 * time.Minute):
					b.Fatal("acks did not arrive")
				}
				b.StopTimer()
				st := in.Stats()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
				b.ReportMetric(float64(ingesttest.ProcessCPU()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/msg")
				if st.Batches > 0 {
					b.ReportMetric(float64(b.N-int(st.Passed))/float64(st.Batches), "msgs/batch")
				}
				b.ReportMetric(float64(st.Passed)/float64(b.N), "passed/msg")
			})
		}
	}
}

// benchPayload is a JSON array of n readings.
func benchPayload(n int) []byte {
	var p []byte
	p = append(p, '[')
	for i := range n {
		if i > 0 {
			p = append(p, ',')
		}
		p = fmt.Appendf(p, `{"ts":%d,"temp":21.%02d,"hum":%d,"ok":true}`, 1795309323456+int64(i)*1000, i%100, 40+i%20)
	}
	return append(p, ']')
}
