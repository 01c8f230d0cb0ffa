package devindex

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/telemetryd/telemetryd/buckets"
)

// BenchmarkDevicesMatch lists devices by attribute among 100,000
// devices in 10 fleets of 10,000 (each device also has one of 7
// models).
func BenchmarkDevicesMatch(b *testing.B) {
	ts := newTestIndex(b)
	fleets := []string{"East", "West", "North", "South", "Alpha", "Beta", "Gamma", "Delta", "Omega", "Zeta"}
	const devices = 100_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for from := 0; from < devices; from += 5000 {
		as := make([]buckets.Assignment, 0, 5000)
		for i := from; i < from+5000; i++ {
			as = append(as, buckets.Assignment{Device: buckets.DeviceID(fmt.Sprintf("dev-%06d", i)), At: 1,
				Set: buckets.Attributes{{Name: "fleet", Value: fleets[i%len(fleets)]}, {Name: "model", Value: fmt.Sprintf("M-%d", i%7)}}})
		}
		if err := ts.Assign(as); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.Logf("heap after assigning 2 attributes to each of %d devices: %d bytes per device", devices,
		(int64(after.HeapAlloc)-int64(before.HeapAlloc))/devices)
	for _, bc := range []struct {
		name  string
		sel   string
		limit int
	}{
		{"no matcher (baseline)/limit=100", `{__name__=~".*"}`, 100},
		{"no matcher (baseline)/limit=1000", `{__name__=~".*"}`, 1000},
		{"fleet!=East (walk)/limit=100", `{fleet!="East"}`, 100},
		{"fleet=East/limit=100", `{fleet="East"}`, 100},
		{"fleet=East/limit=1000", `{fleet="East"}`, 1000},
		{"fleet=East,model=~M-1|M-2/limit=100", `{fleet="East",model=~"M-1|M-2"}`, 100},
		{"fleet=East,model=~M-[12]/limit=100", `{fleet="East",model=~"M-[12]"}`, 100},
		{"fleet=East,model=~M-[12]/limit=1000", `{fleet="East",model=~"M-[12]"}`, 1000},
	} {
		q := buckets.DeviceQuery{Limit: bc.limit, Match: matchers(b, bc.sel)}
		if bc.sel == `{__name__=~".*"}` {
			q.Match = nil
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				devs, _, err := ts.Devices(context.Background(), q)
				if err != nil || len(devs) != bc.limit {
					b.Fatalf("%d devices, %v", len(devs), err)
				}
			}
		})
	}
}

// BenchmarkAssign applies batches of 100 assignments, one per device
// of 10,000, the way ingest does for a message batch whose readings
// carry attributes: each op is one batch (one transaction). Every batch
// is newer than the last, so every record it touches is rewritten, and
// most also move a device to another fleet (two index entities).
func BenchmarkAssign(b *testing.B) {
	ts := newTestIndex(b)
	const batch = 100
	as := make([]buckets.Assignment, batch)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n++
		for i := range as {
			as[i] = buckets.Assignment{Device: buckets.DeviceID(fmt.Sprintf("dev-%06d", (n*batch+i)%10_000)), At: buckets.Ticks(n),
				Set: buckets.Attributes{{Name: "fleet", Value: fmt.Sprintf("F%d", n/10%10)}, {Name: "model", Value: "M"}}}
		}
		if err := ts.Assign(as); err != nil {
			b.Fatal(err)
		}
	}
}
