package store

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// TestMemoryThirtyDays measures memory with a month of data: 30 day
// tables of 100,000 readings each (1000 devices, 3 values), written
// day by day as a running service would (each day hot while written),
// then reopened with default options and queried on every day.
//
// It is slow and only runs with TELEMETRY_MEMTEST=1:
//
//	TELEMETRY_MEMTEST=1 go test ./store/ -run TestMemoryThirtyDays -v -timeout 30m
func TestMemoryThirtyDays(t *testing.T) {
	if os.Getenv("TELEMETRY_MEMTEST") != "1" {
		t.Skip("set TELEMETRY_MEMTEST=1 to run the memory measurement")
	}
	const days, perDay = 30, 100_000
	dir := t.TempDir()
	clock := &testClock{}
	last := today
	first := last - days + 1
	opts := DefaultOptions()
	opts.Logger = quietLogger()
	opts.Now = clock.Now

	s, err := Open(context.Background(), dir, opts)
	require.NoError(t, err)
	start := time.Now()
	for d := first; d <= last; d++ {
		clock.set(d.Start().Time().Add(23 * time.Hour))
		writeDay(t, s, d, perDay)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("write: %d readings in %v; peak RSS %d MiB; now RSS anon %d MiB file %d MiB; Go heap in use %d MiB, sys %d MiB; open tables %d",
		days*perDay, time.Since(start).Round(time.Millisecond), vm(t, "VmHWM")>>10, vm(t, "RssAnon")>>10, vm(t, "RssFile")>>10,
		ms.HeapInuse>>20, ms.Sys>>20, s.stats().open)
	require.NoError(t, s.Close())

	tables := measureQueries(t, dir, opts, first, last)
	var size, readings int64
	for _, ti := range tables {
		size += ti.SizeBytes
		readings += ti.Readings
	}
	require.Len(t, tables, days)
	require.Equal(t, int64(days*perDay), readings)
	t.Logf("disk: %d MiB for %d readings, %.1f bytes/reading", size>>20, readings, float64(size)/float64(readings))
}

// writeDay writes perDay readings spread over day d, 1000 per Write.
func writeDay(t *testing.T, s *Store, d buckets.Day, perDay int) {
	t.Helper()
	step := buckets.Ticks(buckets.TicksPerDay / (perDay / len(benchDevices)))
	var batch []buckets.Reading
	for i := 0; i < perDay/len(benchDevices); i++ {
		batch = batch[:0]
		k := d.Start() + buckets.Ticks(i)*step
		for j, dev := range benchDevices {
			batch = append(batch, buckets.Reading{Device: dev, Ticks: k + buckets.Ticks(j), Values: []buckets.Field{
				{Name: "hum", Value: buckets.Int(int64(40 + (i+j)%30))},
				{Name: "ok", Value: buckets.Bool((i+j)%3 != 0)},
				{Name: "temp", Value: buckets.Float(18 + float64((i*7+j)%100)/7)},
			}})
		}
		require.NoError(t, s.Write(context.Background(), batch))
	}
}

// measureQueries reopens the store and queries every day, logging
// peak RSS (VmHWM, reset before the reopen) and the cost of one open
// cold table.
func measureQueries(t *testing.T, dir string, opts Options, first, last buckets.Day) []buckets.TableInfo {
	t.Helper()
	debug.FreeOSMemory() // as if the service restarted
	resetPeakRSS(t)
	base := vm(t, "VmRSS")
	clock := &testClock{}
	clock.set(last.Start().Time().Add(23 * time.Hour))
	opts.Now = clock.Now
	s, err := Open(context.Background(), dir, opts)
	require.NoError(t, err)
	defer s.Close()
	ctx := context.Background()
	afterOpen := vm(t, "VmRSS")
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heapBefore := ms.HeapInuse

	// Open MaxOpenTables cold tables with a point read each.
	cold := min(opts.MaxOpenTables, int(last-first-1))
	for d := first; d < first+buckets.Day(cold); d++ {
		_, err := s.Get(ctx, benchDevices[0], d.Start())
		require.NoError(t, err)
	}
	debug.FreeOSMemory()
	perTable := (vm(t, "VmRSS") - afterOpen) / int64(cold)
	runtime.ReadMemStats(&ms)
	heapPerTable := (int64(ms.HeapInuse) - int64(heapBefore)) / int64(cold)

	// Every day: latest, a range page in both orders and a point read
	// for a sample of devices, from 4 goroutines at once.
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := first; d <= last; d++ {
				for i := w; i < len(benchDevices); i += 50 {
					dev := benchDevices[i]
					_, err := s.Range(ctx, buckets.RangeQuery{Device: dev, From: d.Start(), To: d.End(), Order: buckets.Asc, Limit: 100})
					require.NoError(t, err)
					_, err = s.Range(ctx, buckets.RangeQuery{Device: dev, From: d.Start(), To: d.End(), Order: buckets.Desc, Limit: 10})
					require.NoError(t, err)
				}
			}
			_, err := s.Latest(ctx, benchDevices[w], 1000)
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	tables, err := s.Tables(ctx)
	require.NoError(t, err)
	runtime.ReadMemStats(&ms)
	t.Logf("query: RSS before open %d MiB, after open %d MiB; one open cold table ~%.1f MiB RSS, %.1f MiB Go heap; peak RSS %d MiB; now RSS anon %d MiB file %d MiB; Go heap in use %d MiB, sys %d MiB; open tables %d",
		base>>10, afterOpen>>10, float64(perTable)/1024, float64(heapPerTable)/(1<<20), vm(t, "VmHWM")>>10, vm(t, "RssAnon")>>10, vm(t, "RssFile")>>10, ms.HeapInuse>>20, ms.Sys>>20, s.stats().open)
	return tables
}

func (c *testClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// vm reads a kB field of /proc/self/status.
func vm(t *testing.T, field string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("%s not in /proc/self/status", field)
	return 0
}

// resetPeakRSS resets VmHWM to the current RSS.
func resetPeakRSS(t *testing.T) {
	t.Helper()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Logf("cannot reset peak RSS (%v); the peak includes the write phase", err)
	}
}
