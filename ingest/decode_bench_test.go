package ingest

import (
	"fmt"
	"strings"
	"testing"
)

func BenchmarkDecode(b *testing.B) {
	var batch strings.Builder
	batch.WriteByte('[')
	for i := range 1000 {
		if i > 0 {
			batch.WriteByte(',')
		}
		fmt.Fprintf(&batch, `{"ts":%d,"temp":%d.25,"humidity":41.5,"ok":true,"rssi":-71}`, exampleMillis+int64(i), 20+i%5)
	}
	batch.WriteByte(']')
	cases := []struct {
		name    string
		payload string
	}{
		{"flat", `{"ts":1795309323456,"temp":21.5,"humidity":41.5,"ok":true,"rssi":-71}`},
		{"nested", `{"ts":"2026-11-22T01:02:03.456Z","values":{"temp":21.5,"humidity":41.5,"ok":true,"rssi":-71}}`},
		{"batch1000", batch.String()},
	}
	for _, c := range cases {
		data := []byte(c.payload)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := Decode("dev-1", data, defaultTicks); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
