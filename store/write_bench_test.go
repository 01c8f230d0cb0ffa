package store

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// tsbsTrucks are the device IDs of tsbsLineBatches.
var tsbsTrucks = func() []buckets.DeviceID {
	ids := make([]buckets.DeviceID, 500)
	for i := range ids {
		ids[i] = buckets.DeviceID(fmt.Sprintf("truck_%d", i))
	}
	return ids
}()

// tsbsBatchReadings is the ingester's default batch.
const tsbsBatchReadings = 5000

// tsbsLineBatches returns what the ingester commits, batch by batch,
// when the TSBS IoT file of 500 trucks (a reading every 10 s) comes
// through the line protocol door in requests of 10,000 lines, two in
// flight: per 10 s, a "readings" line of 10 values per truck, then a
// "diagnostics" line of 6 values for 9 trucks in 10 (they merge into
// one reading of 16 values); each request publishes one message per
// truck of its readings in time order, the messages of two requests
// in flight interleave in the stream, and a batch takes messages until
// it holds 5,000 readings. A request boundary splits the two halves of
// some trucks' readings across requests. steps is the number of 10 s
// steps.
func tsbsLineBatches(steps int) [][]buckets.Reading {
	start := buckets.MustTicks(baseTime.Add(-3 * time.Hour))
	type line struct {
		truck int
		ticks buckets.Ticks
		diag  bool
	}
	var lines []line
	for s := range steps {
		k := start + buckets.Ticks(s)*10*buckets.TicksPerSecond
		for t := range tsbsTrucks {
			lines = append(lines, line{t, k, false})
		}
		for t := range tsbsTrucks {
			if t%10 != 9 {
				lines = append(lines, line{t, k, true})
			}
		}
	}
	values := func(l line) []buckets.Field {
		s := float64(l.ticks-start) / float64(buckets.TicksPerSecond) / 10
		if l.diag {
			return []buckets.Field{
				{Name: "diagnostics.current_load", Value: buckets.Float(float64(l.truck%2000) + s)},
				{Name: "diagnostics.fuel_capacity", Value: buckets.Float(200)},
				{Name: "diagnostics.fuel_state", Value: buckets.Float(float64(int(s)%10) / 10)},
				{Name: "diagnostics.load_capacity", Value: buckets.Float(2000)},
				{Name: "diagnostics.nominal_fuel_consumption", Value: buckets.Float(15)},
				{Name: "diagnostics.status", Value: buckets.Int(int64(s) % 5)},
			}
		}
		return []buckets.Field{
			{Name: "readings.elevation", Value: buckets.Float(100 + float64(int(s)%300))},
			{Name: "readings.fuel_capacity", Value: buckets.Float(200)},
			{Name: "readings.fuel_consumption", Value: buckets.Float(20 + float64(int(s)%15))},
			{Name: "readings.grade", Value: buckets.Float(float64(int(s) % 10))},
			{Name: "readings.heading", Value: buckets.Float(float64((l.truck + int(s)) % 360))},
			{Name: "readings.latitude", Value: buckets.Float(float64(l.truck%90) + s/1e5)},
			{Name: "readings.load_capacity", Value: buckets.Float(2000)},
			{Name: "readings.longitude", Value: buckets.Float(float64(l.truck%180) + s*13/1e5)},
			{Name: "readings.nominal_fuel_consumption", Value: buckets.Float(15)},
			{Name: "readings.velocity", Value: buckets.Float(float64(int(s) % 80))},
		}
	}
	// The messages of each request: per truck its readings in time
	// order, the two halves of a reading merged.
	var requests [][][]buckets.Reading
	for len(lines) > 0 {
		req := lines[:min(10_000, len(lines))]
		lines = lines[len(req):]
		byTruck := make([][]buckets.Reading, len(tsbsTrucks))
		var order []int
		for _, l := range req {
			rs := byTruck[l.truck]
			if len(rs) == 0 {
				order = append(order, l.truck)
			}
			if n := len(rs); n > 0 && rs[n-1].Ticks == l.ticks {
				rs[n-1].Values = buckets.Merge(rs[n-1].Values, values(l))
				continue
			}
			byTruck[l.truck] = append(rs, buckets.Reading{Device: tsbsTrucks[l.truck], Ticks: l.ticks, Values: values(l)})
		}
		var msgs [][]buckets.Reading
		for _, t := range order {
			msgs = append(msgs, byTruck[t])
		}
		requests = append(requests, msgs)
	}
	// Two requests in flight: their messages interleave.
	var stream [][]buckets.Reading
	for i := 0; i < len(requests); i += 2 {
		a, b := requests[i], [][]buckets.Reading(nil)
		if i+1 < len(requests) {
			b = requests[i+1]
		}
		for j := range max(len(a), len(b)) {
			if j < len(a) {
				stream = append(stream, a[j])
			}
			if j < len(b) {
				stream = append(stream, b[j])
			}
		}
	}
	var batches [][]buckets.Reading
	var cur []buckets.Reading
	for _, m := range stream {
		if len(cur) > 0 && len(cur)+len(m) > tsbsBatchReadings {
			batches = append(batches, cur)
			cur = nil
		}
		cur = append(cur, m...)
	}
	return append(batches, cur)
}

// BenchmarkStoreWriteTSBSLines writes the batches of tsbsLineBatches
// (6 hours of 500 trucks, 1.08M readings) through Store.Write, the
// compactor on its timer. cpu-ns/reading is the CPU time of the whole
// process per reading, the compactions still owed at the end included.
func BenchmarkStoreWriteTSBSLines(b *testing.B) {
	batches := tsbsLineBatches(6 * 360)
	n := 0
	for _, rs := range batches {
		n += len(rs)
	}
	ctx := context.Background()
	b.ReportAllocs()
	var elapsed, cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		s := openBenchStore(b)
		in := make([][]buckets.Reading, len(batches))
		for i, rs := range batches {
			in[i] = slices.Clone(rs)
		}
		b.StartTimer()
		start, cpu0 := time.Now(), processCPU(b)
		for _, rs := range in {
			if err := s.Write(ctx, rs); err != nil {
				b.Fatal(err)
			}
		}
		s.compactAll(false)
		elapsed += time.Since(start)
		cpu += processCPU(b) - cpu0
		b.StopTimer()
		s.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.N*n)/elapsed.Seconds(), "readings/s")
	b.ReportMetric(float64(cpu)/float64(b.N*n), "cpu-ns/reading")
}
