package ingest

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// BenchmarkPublishWithMsgID measures what the duplicate window costs
// the server: JetStream publishes of small readings, each with a unique
// Nats-Msg-Id (as telemetry-sim sends them), on a file stream with the
// default 2-minute window and on one without (the readings stream's
// setting). The server is in-process, so B/op and heap-MiB include its
// ID map.
//
//	go test ./ingest -run '^$' -bench PublishWithMsgID -benchtime 200000x
func BenchmarkPublishWithMsgID(b *testing.B) {
	for _, window := range []string{"2m", "2m-discardnew", "off"} {
		b.Run("window="+window, func(b *testing.B) {
			// 2m: an earlier version's stream; 2m-discardnew: the same
			// with discard new; off: the readings stream as set up now
			// (no window, discard new, the source).
			srv := runServer(b, b.TempDir(), -1)
			nc, err := nats.Connect(srv.ClientURL())
			require.NoError(b, err)
			defer nc.Close()
			js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
			require.NoError(b, err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := Config{Stream: "BENCH", SubjectPrefix: "telemetry", StreamMaxBytes: 8 << 30}
			if window == "off" {
				_, err = EnsureStream(ctx, js, c, nil)
			} else {
				sc := jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"telemetry.*"},
					Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute}
				if window == "2m-discardnew" {
					sc.Discard, sc.MaxBytes = jetstream.DiscardNew, 8<<30
				}
				_, err = js.CreateStream(ctx, sc)
			}
			require.NoError(b, err)
			data := []byte(`{"ts":1795309323456,"temp":21.53,"rh":40.2,"ok":true}`)
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				m := nats.NewMsg("telemetry.dev-" + strconv.Itoa(i%1000))
				m.Data = data
				m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("dev-%d-%d", i%1000, i))
				if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				b.Fatal("acks did not arrive")
			}
			b.StopTimer()
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "heap-MiB")
		})
	}
}
