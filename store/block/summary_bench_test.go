package block_test

import (
	"testing"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
)

// BenchmarkEachSummaryOneHour reads the header summaries of a block,
// the read of aggregates over blocks that lie in one bucket: with
// checksums it is the read whose cost grows most, as the checksum
// covers the whole block and the header is a small part of it.
func BenchmarkEachSummaryOneHour(b *testing.B) {
	blk := oneHourBlock(b)
	b.SetBytes(int64(len(blk)))
	var sum float64
	b.ReportAllocs()
	for b.Loop() {
		_, _, err := block.EachSummary(blk, func(_ []byte, s buckets.Summary) { sum += s.Sum })
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeOneHour encodes the readings of one hour into a block.
func BenchmarkEncodeOneHour(b *testing.B) {
	rs := make([]buckets.Reading, 360)
	for i := range rs {
		rs[i] = buckets.Reading{Ticks: start + buckets.Ticks(i)*10*buckets.TicksPerSecond,
			Values: []buckets.Field{{Name: "temp", Value: buckets.Float(float64(i%60) / 6)}}}
	}
	b.ReportAllocs()
	var dst []byte
	for b.Loop() {
		var err error
		if dst, err = block.Encode(dst[:0], rs); err != nil {
			b.Fatal(err)
		}
	}
}
