package wire_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/wire"
	"github.com/telemetryd/telemetryd/ingest"
)

// lineMessage is one message of the line protocol door as the
// telemetry-bench connect run sends it: 100 readings of one device,
// float, int and bool values, whole-millisecond times; as the binary
// form and as the JSON the door published before.
func lineMessage() (bin, json []byte) {
	const ms = 1795309323000
	var e wire.Encoder
	e.Reset()
	json = append(json, '[')
	for i := range 100 {
		temp, hum, ok := float64(18+i%10)+0.37, int64(30+i%40), i%2 == 0
		k := buckets.MustTicks(time.UnixMilli(ms + int64(i)*1000))
		e.Add(k, []buckets.Field{
			{Name: "env.hum", Value: buckets.Int(hum)},
			{Name: "env.ok", Value: buckets.Bool(ok)},
			{Name: "env.temp", Value: buckets.Float(temp)},
		})
		if i > 0 {
			json = append(json, ',')
		}
		json = fmt.Appendf(json, `{"ts":%d,"values":{"env.hum":%d,"env.ok":%t,"env.temp":%g}}`, ms+int64(i)*1000, hum, ok, temp)
	}
	return e.Append(nil), append(json, ']')
}

// BenchmarkDecodeLineMessage compares what the ingester spends on one
// 100-reading message of the line protocol door in each form.
func BenchmarkDecodeLineMessage(b *testing.B) {
	bin, json := lineMessage()
	b.Run("binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if rs, _, err := wire.Decode("dev-1", bin); err != nil || len(rs) != 100 {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if rs, _, err := ingest.Decode("dev-1", json, 0); err != nil || len(rs) != 100 {
				b.Fatal(err)
			}
		}
	})
}
