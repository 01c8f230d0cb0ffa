package lineproto

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkMap5000 maps one request of 5,000 lines over 50 devices.
func BenchmarkMap5000(b *testing.B) {
	var body []byte
	at := now.Add(-time.Hour)
	for i := range 5000 {
		body = fmt.Appendf(body, "env,device=sensor-building-%02d-floor-1-%04d temp=%d.37,hum=%di,ok=true %d\n",
			i%50, i%50, 18+i%10, 30+i%40, at.Add(time.Duration(i/50)*time.Second).UnixNano())
	}
	o := opts()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		res := Map(body, o)
		if len(res.Rejected) > 0 || res.Readings != 5000 {
			b.Fatalf("%d rejected, %d readings: %v", len(res.Rejected), res.Readings, res.Rejected[0])
		}
	}
}
