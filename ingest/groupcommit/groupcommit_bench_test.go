package groupcommit

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/store"
)

// BenchmarkPartitionWriters measures what the store commits of eight
// partition ingesters cost at one reading per message: each of eight
// writers commits batches of batch readings (one per device of its 125)
// as fast as the store takes them, straight to the store (each its own
// commit, one after the other under the day table's lock) and through
// a Group. It reports readings/s, the process's CPU ns per reading and
// the store commits per second.
//
//	go test ./ingest/groupcommit -run '^$' -bench PartitionWriters -benchtime 400000x
func BenchmarkPartitionWriters(b *testing.B) {
	for _, synced := range []bool{false, true} {
		for _, batch := range []int{25, 500} {
			for _, grouped := range []bool{false, true} {
				name := fmt.Sprintf("synced=%v/batch=%d/grouped=%v", synced, batch, grouped)
				b.Run(name, func(b *testing.B) { benchWriters(b, synced, batch, grouped) })
			}
		}
	}
}

// counting counts the Write calls that reach w.
type counting struct {
	ingest.Writer
	mu    sync.Mutex
	calls int
}

func (c *counting) Write(ctx context.Context, rs []buckets.Reading) error {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	return c.Writer.Write(ctx, rs)
}

func benchWriters(b *testing.B, synced bool, batch int, grouped bool) {
	opts := store.DefaultOptions()
	opts.SyncWrites = synced
	ctx := context.Background()
	s, err := store.Open(ctx, b.TempDir(), opts)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	c := &counting{Writer: s}
	var w ingest.Writer = c
	if grouped {
		w = New(c)
	}
	const writers, devices = 8, 125
	start, err := buckets.TicksOf(time.Now().Add(-time.Hour).Truncate(time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	perWriter := max(b.N/writers/batch, 1)
	cpu0 := cpuTime()
	b.ResetTimer()
	began := time.Now()
	var wg sync.WaitGroup
	for p := range writers {
		wg.Go(func() {
			rs := make([]buckets.Reading, batch)
			n := 0
			for range perWriter {
				for i := range rs {
					rs[i] = buckets.Reading{
						Device: buckets.DeviceID(fmt.Sprintf("p%d-dev-%d", p, n%devices)),
						Ticks:  start + buckets.Ticks(n/devices)*buckets.TicksPerSecond,
						Values: []buckets.Field{{Name: "temp", Value: buckets.Float(float64(n % 40))}},
					}
					n++
				}
				if err := w.Write(ctx, rs); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	b.StopTimer()
	total := float64(writers * perWriter * batch)
	b.ReportMetric(total/elapsed.Seconds(), "readings/s")
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/total, "cpu-ns/reading")
	b.ReportMetric(float64(c.calls)/elapsed.Seconds(), "commits/s")
}

// cpuTime is the CPU time (user and system) the process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
