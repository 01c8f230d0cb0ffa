package ingest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/telemetryd/telemetryd/buckets"
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

// BenchmarkRecordLag records the lag histogram of one 5000-reading
// batch with the SDK, from the batch span's context as commit does.
func BenchmarkRecordLag(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	m, err := newMetrics(mp)
	if err != nil {
		b.Fatal(err)
	}
	ctx, span := sdktrace.NewTracerProvider().Tracer("bench").Start(context.Background(), "ingest.batch")
	defer span.End()
	now := buckets.MustTicks(time.Now())
	rs := make([]buckets.Reading, 5000)
	for i := range rs {
		rs[i].Ticks = now - buckets.Ticks(i)*buckets.TicksPerSecond
	}
	b.ReportAllocs()
	for b.Loop() {
		m.recordLag(ctx, rs, now)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rs)), "ns/reading")
}
