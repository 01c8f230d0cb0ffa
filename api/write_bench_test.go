package api_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/buckets/wire"
	"github.com/telemetryd/telemetryd/ingest/lineproto"
)

// countingPublisher acknowledges every message at once and counts the
// readings of those it was given (it stands in for JetStream, whose
// cost the connect phase of telemetry-bench measures).
type countingPublisher struct{ readings atomic.Int64 }

func (p *countingPublisher) Publish(_ context.Context, msgs []linemsg.Message) error {
	for _, m := range msgs {
		p.readings.Add(int64(wire.Count(m.Data)))
	}
	return nil
}

// benchLines is a write request of n lines shaped like telemetry-bench's
// connect phase: 100 consecutive readings per device, three fields.
func benchLines(n int, at time.Time) []byte {
	var b []byte
	for i := range n {
		dev := i / 100
		b = fmt.Appendf(b, "env,device=bench-%06d temp=%d.%02d,hum=%di,ok=%t %d\n",
			dev, 18+i%10, i%100, 30+i%40, i%5 != 0, at.Add(time.Duration(i%100)*time.Second).UnixNano())
	}
	return b
}

// BenchmarkWriteDoor posts 5,000-line requests to POST /api/v2/write
// over loopback HTTP, plain and gzipped: body read, gunzip, parse,
// validate, merge, encode and the 204. ns/line is the door's cost per
// line apart from JetStream.
func BenchmarkWriteDoor(b *testing.B) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	const lines = 5000
	body := benchLines(lines, now.Add(-time.Hour))
	var zbody bytes.Buffer
	zw := gzip.NewWriter(&zbody)
	_, _ = zw.Write(body)
	_ = zw.Close()
	for _, tc := range []struct {
		name string
		body []byte
		enc  string
	}{{"plain", body, ""}, {"gzip", zbody.Bytes(), "gzip"}} {
		b.Run(tc.name, func(b *testing.B) {
			pub := &countingPublisher{}
			srv, err := api.New(api.Config{Reader: newFakeReader(), Logger: slog.New(slog.DiscardHandler),
				Now: func() time.Time { return now }, Writes: &api.WriteConfig{Publisher: pub, Mapper: lineproto.Mapper{}}})
			if err != nil {
				b.Fatal(err)
			}
			hs := httptest.NewServer(srv.Handler())
			defer hs.Close()
			client := hs.Client()
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, hs.URL+"/api/v2/write?bucket=b&precision=ns", bytes.NewReader(tc.body))
				if tc.enc != "" {
					req.Header.Set("Content-Encoding", tc.enc)
				}
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				msg, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusNoContent {
					b.Fatalf("%s: %s", resp.Status, msg)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*lines), "ns/line")
			if got := pub.readings.Load(); got != int64(b.N*lines) {
				b.Fatalf("published %d readings, want %d", got, b.N*lines)
			}
		})
	}
}
