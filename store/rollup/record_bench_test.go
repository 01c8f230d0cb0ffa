package rollup

import (
	"testing"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// benchRecord is a full record of a one-minute level: 60 buckets of
// four values each, as a device reporting every few seconds leaves.
func benchRecord() (Level, buckets.Ticks, []Bucket) {
	l := Level{Interval: time.Minute, Retention: Day}
	ss := WindowStart(buckets.MustTicks(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)))
	iv := l.ticks()
	bs := make([]Bucket, 60)
	for i := range bs {
		k := ss + buckets.Ticks(i)*iv
		bs[i] = Bucket{Start: k, DistinctMs: true}
		for j, name := range []string{"humidity", "pressure", "temperature", "voltage"} {
			var s buckets.Summary
			for n := range 12 {
				s.Add(k+buckets.Ticks(n)*iv/12, float64(i*j)+float64(n)/8)
			}
			bs[i].Values = append(bs[i].Values, buckets.NamedSummary{Name: name, Summary: s})
		}
	}
	return l, ss, bs
}

func BenchmarkAppendRecord(b *testing.B) {
	l, ss, bs := benchRecord()
	var dst []byte
	b.ReportAllocs()
	for b.Loop() {
		dst = appendRecord(dst[:0], ss, l.ticks(), bs)
	}
	b.SetBytes(int64(len(dst)))
}

// BenchmarkDecodeRecord decodes one record with a decoder of its own,
// as a scan's first record is.
func BenchmarkDecodeRecord(b *testing.B) {
	l, ss, bs := benchRecord()
	v := appendRecord(nil, ss, l.ticks(), bs)
	b.SetBytes(int64(len(v)))
	b.ReportAllocs()
	for b.Loop() {
		if err := decodeRecord(v, ss, l.ticks(), l.span(), &decoder{}, func(Bucket) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
