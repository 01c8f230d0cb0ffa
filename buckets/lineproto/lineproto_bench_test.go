package lineproto

import (
	"fmt"
	"testing"
	"time"

	lp "github.com/influxdata/line-protocol/v2/lineprotocol"
)

// benchBody is one request of 5,000 lines over 50 devices, as
// telemetry-bench -phases connect sends them.
func benchBody() []byte {
	var body []byte
	at := now.Add(-time.Hour)
	for i := range 5000 {
		body = fmt.Appendf(body, "env,device=sensor-building-%02d-floor-1-%04d temp=%d.37,hum=%di,ok=true %d\n",
			i%50, i%50, 18+i%10, 30+i%40, at.Add(time.Duration(i/50)*time.Second).UnixNano())
	}
	return body
}

// BenchmarkMap5000 maps one request: parse, validate, merge, encode.
func BenchmarkMap5000(b *testing.B) {
	body := benchBody()
	o := opts()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		res := Map(body, o)
		if len(res.Rejected) > 0 || res.Readings != 5000 {
			b.Fatalf("%d rejected, %d readings", len(res.Rejected), res.Readings)
		}
	}
}

// BenchmarkDecoderOnly5000 is the parser alone walking every part of
// the same request: the floor under BenchmarkMap5000.
func BenchmarkDecoderOnly5000(b *testing.B) {
	body := benchBody()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		dec := lp.NewDecoderWithBytes(body)
		n := 0
		for dec.Next() {
			if _, err := dec.Measurement(); err != nil {
				b.Fatal(err)
			}
			for k, _, _ := dec.NextTag(); k != nil; k, _, _ = dec.NextTag() {
			}
			for k, _, _ := dec.NextField(); k != nil; k, _, _ = dec.NextField() {
			}
			if _, err := dec.TimeBytes(); err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n != 5000 {
			b.Fatalf("%d lines", n)
		}
	}
}

// BenchmarkMap5000Tags maps the request of BenchmarkMap5000 with two
// more tags on every line, as attributes and as values.
func BenchmarkMap5000Tags(b *testing.B) {
	var body []byte
	at := now.Add(-time.Hour)
	for i := range 5000 {
		body = fmt.Appendf(body, "env,device=sensor-building-%02d-floor-1-%04d,site=north,floor=f%d temp=%d.37,hum=%di,ok=true %d\n",
			i%50, i%50, i%5, 18+i%10, 30+i%40, at.Add(time.Duration(i/50)*time.Second).UnixNano())
	}
	for _, mode := range []struct {
		name string
		tags TagMode
	}{{"attributes", TagsAsAttributes}, {"values", TagsAsValues}} {
		b.Run(mode.name, func(b *testing.B) {
			o := opts()
			o.Tags = mode.tags
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				res := Map(body, o)
				if len(res.Rejected) > 0 || res.Readings != 5000 {
					b.Fatalf("%d rejected, %d readings", len(res.Rejected), res.Readings)
				}
			}
		})
	}
}
