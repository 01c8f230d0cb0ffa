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

// BenchmarkDecodeAttributes decodes the flat form with an attributes
// object of three names, the cost of a device that sends its attributes
// with every reading (compare BenchmarkDecode/flat).
func BenchmarkDecodeAttributes(b *testing.B) {
	data := []byte(`{"ts":1795309323456,"temp":21.5,"humidity":41.5,"ok":true,"rssi":-71,` +
		`"attributes":{"fleet":"East","model":"F-150","site":"depot-3"}}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, as, err := Decode("dev-1", data, defaultTicks); err != nil || len(as) != 1 {
			b.Fatal(err)
		}
	}
}
