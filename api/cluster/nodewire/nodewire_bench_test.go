package nodewire_test

import (
	"testing"

	"github.com/telemetryd/telemetryd/api/cluster/nodewire"
	"github.com/telemetryd/telemetryd/buckets"
)

// benchFields are the values of a typical reading: whole and
// fractional floats, an int, a bool and a short string.
var benchFields = []buckets.Field{
	{Name: "battery", Value: buckets.Int(87)},
	{Name: "door_open", Value: buckets.Bool(false)},
	{Name: "firmware", Value: buckets.String("4.2.1")},
	{Name: "humidity", Value: buckets.Float(41)},
	{Name: "pressure", Value: buckets.Float(1013.25)},
	{Name: "rssi", Value: buckets.Float(-71)},
	{Name: "temperature", Value: buckets.Float(21.375)},
	{Name: "voltage", Value: buckets.Float(3.2871)},
}

func BenchmarkAppendValues(b *testing.B) {
	var dst []byte
	b.ReportAllocs()
	for b.Loop() {
		dst = nodewire.AppendValues(dst[:0], benchFields)
	}
	b.SetBytes(int64(len(dst)))
}

func BenchmarkDecodeValues(b *testing.B) {
	enc := nodewire.AppendValues(nil, benchFields)
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := nodewire.DecodeValues(enc); err != nil {
			b.Fatal(err)
		}
	}
}
