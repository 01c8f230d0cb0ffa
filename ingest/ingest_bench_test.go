package ingest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// BenchmarkIngest measures the pipeline without storage: messages of
// ten readings waiting in the stream are pulled, decoded, batched,
// handed to a writer that returns at once, and acked. It reports
// readings per second.
func BenchmarkIngest(b *testing.B) {
	e := newTestEnv(b, nil)
	e.setup()
	ctx := context.Background()
	ms := nowMillis()
	var last uint64
	for i := range b.N {
		var p strings.Builder
		p.WriteByte('[')
		for j := range 10 {
			if j > 0 {
				p.WriteByte(',')
			}
			fmt.Fprintf(&p, `{"ts":%d,"temp":%d.5,"humidity":40.25,"ok":true}`, ms+int64(i), j)
		}
		p.WriteByte(']')
		if _, err := e.js.PublishAsync(fmt.Sprintf("telemetry.dev-%d", i%100), []byte(p.String())); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publish did not complete")
	}
	st, err := e.js.Stream(ctx, "TELEMETRY")
	if err != nil {
		b.Fatal(err)
	}
	last = st.CachedInfo().State.LastSeq
	b.ReportAllocs()
	b.ResetTimer()
	e.start()
	for {
		info := e.consumerInfo()
		if info.NumAckPending == 0 && info.AckFloor.Stream >= last {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(10*b.N)/b.Elapsed().Seconds(), "readings/s")
	if n := len(e.w.stored("")); n != 10*b.N {
		b.Fatalf("stored %d readings, want %d", n, 10*b.N)
	}
}
