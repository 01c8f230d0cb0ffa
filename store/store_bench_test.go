package store

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/badgeropts"
	"github.com/telemetryd/telemetryd/store/devindex"
)

// benchDevices are 1000 device IDs of 31 characters: with the separator
// and 8 bytes of inverted ticks a storage key is 40 bytes.
var benchDevices = func() []buckets.DeviceID {
	ids := make([]buckets.DeviceID, 1000)
	for i := range ids {
		ids[i] = buckets.DeviceID(fmt.Sprintf("sensor-building-%02d-floor-%d-%04d", i%20, i%7, i))
	}
	return ids
}()

// benchBatch returns batch number n: one 3-value reading per device,
// all at a time that no other batch uses.
func benchBatch(n int) []buckets.Reading {
	k := buckets.MustTicks(baseTime) + buckets.Ticks(n)*buckets.TicksPerSecond/10
	rs := make([]buckets.Reading, len(benchDevices))
	for i, d := range benchDevices {
		rs[i] = buckets.Reading{Device: d, Ticks: k, Values: []buckets.Field{
			{Name: "hum", Value: buckets.Int(int64(40 + i%30))},
			{Name: "ok", Value: buckets.Bool(i%3 != 0)},
			{Name: "temp", Value: buckets.Float(18 + float64(i%100)/7)},
		}}
	}
	return rs
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// BenchmarkRawBadgerWriteBatch writes the keys and values the store
// writes with a plain Badger WriteBatch on a DB with the options of a
// hot day table: the floor under BenchmarkStoreWrite.
func BenchmarkRawBadgerWriteBatch(b *testing.B) {
	db, err := badger.Open(badgeropts.For(b.TempDir(), badgeropts.Hot, false, false, quietLogger()))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	batches := make([][]buckets.Reading, 64)
	for i := range batches {
		batches[i] = benchBatch(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for n := 0; n < b.N; n++ {
		rs := benchBatch(n)
		wb := db.NewWriteBatch()
		for _, r := range rs {
			if err := wb.Set(appendReadingKey(nil, r.Device, r.Ticks), devindex.AppendValues(nil, r.Values)); err != nil {
				b.Fatal(err)
			}
		}
		if err := wb.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(benchDevices))/time.Since(start).Seconds(), "readings/s")
}

// BenchmarkStoreWrite is Store.Write in batches of 1000 readings over
// 1000 devices: validation, read-before-write merge, one transaction
// per table, reading counter and device index included. cpu-ns/reading
// is the CPU time of the whole process, the compactor's included (the
// compactions it still owes at the end are run before the clock
// stops), so it holds on a busy machine too.
func BenchmarkStoreWrite(b *testing.B) { benchWriteOneEach(b, 0) }

// BenchmarkStoreWriteCompactedEvery8 is BenchmarkStoreWrite with the
// compactor run by the benchmark itself after every eighth commit
// instead of on a timer, so that the work per reading does not depend
// on how fast the machine is that moment: for comparing builds of the
// compactor on a busy machine.
func BenchmarkStoreWriteCompactedEvery8(b *testing.B) { benchWriteOneEach(b, 8) }

// benchWriteOneEach writes benchBatch after benchBatch, running the
// compactor after every every-th commit, or on its timer if every is 0.
func benchWriteOneEach(b *testing.B, every int) {
	var opts []func(*Options)
	if every > 0 {
		opts = append(opts, func(o *Options) { o.CompactInterval = time.Hour })
	}
	s := openBenchStore(b, opts...)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU(b)
	for n := 0; n < b.N; n++ {
		if err := s.Write(ctx, benchBatch(n)); err != nil {
			b.Fatal(err)
		}
		if every > 0 && n%every == every-1 {
			s.compactAll(false)
		}
	}
	s.compactAll(false)
	b.ReportMetric(float64(b.N*len(benchDevices))/time.Since(start).Seconds(), "readings/s")
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N*len(benchDevices)), "cpu-ns/reading")
}

// processCPU is the user and system CPU time of the process so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStoreWriteDeviceRuns is Store.Write of what the ingester
// commits when devices send 100 readings per message: each call holds
// 50 devices x 100 consecutive seconds, and the next call the next 50
// devices over the same 100 seconds, so most readings are not newer
// than the newest one in the table.
func BenchmarkStoreWriteDeviceRuns(b *testing.B) {
	s := openBenchStore(b)
	ctx := context.Background()
	start0 := buckets.MustTicks(baseTime.Add(-3 * time.Hour))
	rs := make([]buckets.Reading, 0, 5000)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for n := 0; n < b.N; n++ {
		rs = rs[:0]
		round, group := n/20, n%20 // 20 groups of 50 devices per 100-second window
		for d := group * 50; d < group*50+50; d++ {
			for i := range 100 {
				k := start0 + buckets.Ticks(round*100+i)*buckets.TicksPerSecond
				rs = append(rs, buckets.Reading{Device: benchDevices[d], Ticks: k, Values: []buckets.Field{
					{Name: "hum", Value: buckets.Int(int64(40 + i%30))},
					{Name: "ok", Value: buckets.Bool(i%3 != 0)},
					{Name: "temp", Value: buckets.Float(18 + float64(i%100)/7)},
				}})
			}
		}
		if err := s.Write(ctx, rs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*5000)/time.Since(start).Seconds(), "readings/s")
}

// openBenchStore opens a store with default options, adjusted by opts,
// on a temporary directory at baseTime, closed when b ends.
func openBenchStore(b *testing.B, opts ...func(*Options)) *Store {
	b.Helper()
	o := DefaultOptions()
	o.Logger = quietLogger()
	o.Now = func() time.Time { return baseTime }
	for _, f := range opts {
		f(&o)
	}
	s, err := Open(context.Background(), b.TempDir(), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}
