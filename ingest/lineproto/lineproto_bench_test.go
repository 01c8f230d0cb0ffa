package lineproto

import (
	"fmt"
	"testing"
	"time"

	lp "github.com/influxdata/line-protocol/v2/lineprotocol"

	"github.com/telemetryd/telemetryd/buckets/linemsg"
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
		tags linemsg.TagMode
	}{{"attributes", linemsg.TagsAsAttributes}, {"values", linemsg.TagsAsValues}} {
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

// tsbsBody is one request of n lines shaped as the TSBS IoT use case
// (tsbs_generate_data --use-case=iot --format=influx) writes them: per
// time, a "readings" line of 10 values for each of trucks trucks, then
// a "diagnostics" line of 6 values for most of them (same truck, same
// time: the two merge into one reading), tags besides the name being
// attributes of the truck.
func tsbsBody(n, trucks int) []byte {
	var body []byte
	at := now.Add(-time.Hour)
	fleets := []string{"East", "West", "North", "South"}
	for lines, step := 0, 0; lines < n; step++ {
		ts := at.Add(time.Duration(step) * 10 * time.Second).UnixNano()
		for _, meas := range []string{"readings", "diagnostics"} {
			for t := 0; t < trucks && lines < n; t++ {
				if meas == "diagnostics" && t%10 == 9 {
					continue
				}
				body = fmt.Appendf(body, "%s,name=truck_%d,fleet=%s,driver=Driver%d,model=F-%d,device_version=v1.%d ",
					meas, t, fleets[t%4], t%7, 100+t%3, t%5)
				if meas == "readings" {
					body = fmt.Appendf(body, "load_capacity=2000,fuel_capacity=200,nominal_fuel_consumption=15,latitude=%d.%05d,longitude=%d.%05d,elevation=%d,velocity=%d,heading=%d,grade=%d,fuel_consumption=%d",
						t%90, (step*7+t)%100000, t%180, (step*13+t)%100000, 100+step%300, step%80, (t+step)%360, step%10, 20+step%15)
				} else {
					body = fmt.Appendf(body, "load_capacity=2000,fuel_capacity=200,nominal_fuel_consumption=15,fuel_state=0.%d,current_load=%d,status=%di",
						step%10, (t*step)%2000, step%5)
				}
				body = fmt.Appendf(body, " %d\n", ts)
				lines++
			}
		}
	}
	return body
}

// BenchmarkMapTSBS maps one request of 10,000 TSBS IoT lines over 500
// trucks, as telemetry-bench -peer-binary sends them.
func BenchmarkMapTSBS(b *testing.B) {
	body := tsbsBody(10_000, 500)
	o := opts()
	o.DeviceTags = []string{"name"}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		res := Map(body, o)
		if len(res.Rejected) > 0 || len(res.Messages) != 500 {
			b.Fatalf("%d rejected, %d messages", len(res.Rejected), len(res.Messages))
		}
	}
}
