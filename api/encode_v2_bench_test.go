//go:build goexperiment.jsonv2

package api

import (
	"bytes"
	"encoding/json/jsontext"
	jsonv2 "encoding/json/v2"
	"fmt"
	"testing"
)

// BenchmarkReadingListJSONv2 encodes the same reading lists with
// encoding/json/v2 (GOEXPERIMENT=jsonv2 go test ./api -bench ReadingList).
func BenchmarkReadingListJSONv2(b *testing.B) {
	for _, n := range benchListSizes {
		rs := benchReadings(n)
		b.Run(fmt.Sprintf("encoding-json-v2/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var w bytes.Buffer
			for b.Loop() {
				w.Reset()
				if err := jsonv2.MarshalWrite(&w, readingListOf("sensor-0042", rs, nil, "cursor"), jsontext.EscapeForHTML(false)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
