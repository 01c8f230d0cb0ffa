package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// benchReadings makes n readings with five values each, like a typical
// environmental sensor.
func benchReadings(n int) []buckets.Reading {
	base := buckets.MustTicks(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	rs := make([]buckets.Reading, n)
	for i := range rs {
		rs[i] = buckets.Reading{Device: "sensor-0042", Ticks: base + buckets.Ticks(i)*buckets.TicksPerSecond, Values: []buckets.Field{
			{Name: "battery", Value: buckets.Float(3.71)},
			{Name: "door_open", Value: buckets.Bool(i%7 == 0)},
			{Name: "humidity", Value: buckets.Float(41.25 + float64(i%10))},
			{Name: "rssi", Value: buckets.Int(-67)},
			{Name: "temp", Value: buckets.Float(21.5 + float64(i%100)/10)},
		}}
	}
	return rs
}

// The hot paths answer with reading lists: latest-10 (10 readings), a
// range page (1,000 by default) and a one-hour range at one reading per
// second (3,600). Each is written by the appenders and, for comparison,
// by encoding/json from the response types.
var benchListSizes = []int{10, 1000, 3600}

func BenchmarkReadingList(b *testing.B) {
	for _, n := range benchListSizes {
		rs := benchReadings(n)
		b.Run(fmt.Sprintf("appenders/%d", n), func(b *testing.B) {
			benchSendReadingList(b, rs, func() (http.ResponseWriter, func() int) {
				rec := httptest.NewRecorder()
				return rec, rec.Body.Len
			})
		})
		b.Run(fmt.Sprintf("encoding-json/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var w bytes.Buffer
			for b.Loop() {
				w.Reset()
				enc := json.NewEncoder(&w)
				enc.SetEscapeHTML(false)
				if err := enc.Encode(readingListOf("sensor-0042", rs, nil, "cursor")); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// pageReader serves the same page to every range query.
type pageReader struct{ page buckets.Page }

func (p pageReader) Latest(context.Context, buckets.DeviceID, int) ([]buckets.Reading, error) {
	return p.page.Readings, nil
}
func (p pageReader) Range(context.Context, buckets.RangeQuery) (buckets.Page, error) {
	return p.page, nil
}
func (p pageReader) Get(context.Context, buckets.DeviceID, buckets.Ticks) (buckets.Reading, error) {
	return p.page.Readings[0], nil
}
func (p pageReader) Devices(context.Context, buckets.DeviceQuery) ([]buckets.DeviceInfo, bool, error) {
	return nil, false, nil
}
func (p pageReader) Tables(context.Context) ([]buckets.TableInfo, error) { return nil, nil }

// BenchmarkRangeRequest1000 measures a whole range request (routing,
// parameters, cursor, tracing and metrics with the no-op providers,
// encoding) for a 1000-reading page.
func BenchmarkRangeRequest1000(b *testing.B) {
	srv, err := New(Config{Reader: pageReader{buckets.Page{Readings: benchReadings(1000), More: true}},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	h := srv.Handler()
	req := httptest.NewRequest(http.MethodGet, "/v1/devices/sensor-0042/readings?from=2026-11-22T00:00:00Z&to=2026-11-23T00:00:00Z", nil)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatal(rec.Code, rec.Body.String())
		}
	}
}

// BenchmarkLatestRequest10 measures a whole latest-10 request (routing,
// parameters, tracing and metrics with the no-op providers, encoding).
func BenchmarkLatestRequest10(b *testing.B) {
	srv, err := New(Config{Reader: pageReader{buckets.Page{Readings: benchReadings(10)}},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	h := srv.Handler()
	req := httptest.NewRequest(http.MethodGet, "/v1/devices/sensor-0042/readings/latest?limit=10", nil)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatal(rec.Code, rec.Body.String())
		}
	}
}

// benchAggregates is a day of one-minute buckets of three values.
func benchAggregates() []buckets.AggregateBucket {
	base := buckets.MustTicks(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	bs := make([]buckets.AggregateBucket, 1440)
	for i := range bs {
		bs[i].Start = base + buckets.Ticks(i)*60*buckets.TicksPerSecond
		for _, name := range []string{"humidity", "rssi", "temp"} {
			var sm buckets.Summary
			for j := range 6 {
				sm.Add(bs[i].Start+buckets.Ticks(j)*10*buckets.TicksPerSecond, 20+float64((i+j)%17)/4)
			}
			bs[i].Values = append(bs[i].Values, buckets.NamedSummary{Name: name, Summary: sm})
		}
	}
	return bs
}

// BenchmarkAggregates encodes a day of one-minute buckets (1,440 x 3
// values, count,min,max,avg) from the response type with encoding/json.
func BenchmarkAggregates(b *testing.B) {
	bs := benchAggregates()
	b.ReportAllocs()
	var w bytes.Buffer
	for b.Loop() {
		w.Reset()
		enc := json.NewEncoder(&w)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(aggregatesOf("sensor-0042", 60*buckets.TicksPerSecond, fnDefault, bs, "")); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(w.Len()), "bytes/page")
}

// BenchmarkAggregatesAppenders is the same page through hand-written
// appenders.
func BenchmarkAggregatesAppenders(b *testing.B) {
	bs := benchAggregates()
	b.ReportAllocs()
	for b.Loop() {
		buf := getBuf()
		*buf = appendAggregates(*buf, "sensor-0042", aggregateCursor{Interval: 60 * buckets.TicksPerSecond, Fns: fnDefault}, bs, "")
		putBuf(buf)
	}
}

// discardWriter is a ResponseWriter that keeps nothing but the byte
// count, so that a benchmark measures the encoding and not a recorder's
// growing buffer.
type discardWriter struct {
	h http.Header
	n int
}

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) WriteHeader(int)     {}
func (w *discardWriter) Write(b []byte) (int, error) {
	w.n += len(b)
	return len(b), nil
}

// BenchmarkReadingListDiscard is the appenders of BenchmarkReadingList
// writing to a ResponseWriter that discards: the encoding and the
// chunked writes of sendReadingList alone.
func BenchmarkReadingListDiscard(b *testing.B) {
	for _, n := range benchListSizes {
		rs := benchReadings(n)
		b.Run(fmt.Sprintf("appenders/%d", n), func(b *testing.B) {
			benchSendReadingList(b, rs, func() (http.ResponseWriter, func() int) {
				w := &discardWriter{h: http.Header{}}
				return w, func() int { return w.n }
			})
		})
	}
}

// benchSendReadingList measures sendReadingList writing rs as one page
// to a fresh writer from newWriter per call; written reports its size.
func benchSendReadingList(b *testing.B, rs []buckets.Reading, newWriter func() (w http.ResponseWriter, written func() int)) {
	srv, err := New(Config{Reader: pageReader{}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	b.ReportAllocs()
	var size int
	for b.Loop() {
		w, written := newWriter()
		if err := srv.sendReadingList(srv.echo.NewContext(req, w), "sensor-0042", rs, nil, "cursor"); err != nil {
			b.Fatal(err)
		}
		size = written()
	}
	b.ReportMetric(float64(size), "bytes/page")
}
