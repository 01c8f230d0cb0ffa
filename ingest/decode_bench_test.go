package ingest

import "testing"

// BenchmarkDecode decodes the three payload forms (flat, nested, a
// batch of 1,000) with Decode; BenchmarkDecodeStdJSON (and, with
// GOEXPERIMENT=jsonv2, BenchmarkDecodeJSONv2) decode the same payloads
// with the standard library.
func BenchmarkDecode(b *testing.B) {
	for _, c := range benchPayloads() {
		data := []byte(c.payload)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, _, err := Decode("dev-1", data, defaultTicks); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
