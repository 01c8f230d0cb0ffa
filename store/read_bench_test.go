package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// readDevices and readPerDevice shape the table the read benchmarks
// query: devices at one reading per second with three decimal values
// (the simulator's), written ten readings per device per commit and
// then closed, so each device holds sealed one-hour blocks of 3,600
// readings, as a service's idle day table does.
const (
	readDevices   = 100
	readPerDevice = 10_000
)

// readTable builds that table and returns it with the tick of the
// first reading.
func readTable(b *testing.B) (*testStore, buckets.Ticks) {
	b.Helper()
	clock := newTestClock()
	ts := openTestStore(b, b.TempDir(), clock)
	first := dayTick(today, time.Hour)
	ctx := context.Background()
	batch := make([]buckets.Reading, 0, 10*readDevices)
	for i := 0; i < readPerDevice; i += 10 {
		for d := range readDevices {
			for j := i; j < i+10; j++ {
				k := first + buckets.Ticks(j)*buckets.TicksPerSecond
				batch = append(batch, reading(fmt.Sprintf("dev-%03d", d), k,
					"battery", float64(9000-j/60)/100, "humidity", float64(4000+(j*7+d)%97)/100, "temp", float64(2100+(j+d)%61)/100))
			}
		}
		require.NoError(b, ts.Write(ctx, batch))
		batch = batch[:0]
	}
	return ts.reopen(b), first
}

// BenchmarkReadLatest10: the newest 10 readings of a random device
// (the idle latest-10 of the service's query benchmark).
func BenchmarkReadLatest10(b *testing.B) {
	ts, _ := readTable(b)
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		rs, err := ts.Latest(ctx, buckets.DeviceID(fmt.Sprintf("dev-%03d", rng.IntN(readDevices))), 10)
		if err != nil || len(rs) != 10 {
			b.Fatal(len(rs), err)
		}
	}
}

// BenchmarkReadRangeOneHour: one hour (3,600 readings) of a random
// device from a random second, oldest first, so it spans two sealed
// blocks.
func BenchmarkReadRangeOneHour(b *testing.B) {
	ts, first := readTable(b)
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	hour := buckets.Ticks(3600) * buckets.TicksPerSecond
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		from := first + buckets.Ticks(rng.IntN(readPerDevice-3600))*buckets.TicksPerSecond
		p, err := ts.Range(ctx, buckets.RangeQuery{Device: buckets.DeviceID(fmt.Sprintf("dev-%03d", rng.IntN(readDevices))),
			From: from, To: from + hour, Order: buckets.Asc, Limit: 10_000})
		if err != nil || len(p.Readings) != 3600 {
			b.Fatal(len(p.Readings), err)
		}
	}
}
