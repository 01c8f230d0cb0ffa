package store

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// Crash test data: reading i belongs to device i%crashDevices at
// crashBase + i/crashDevices seconds with value n=i; every seventh
// write also merges m=i into reading i-70 of the same device.
const (
	crashDevices = 10
	crashEnv     = "STORE_CRASH_CHILD"
)

var crashBase = dayTick(today, time.Hour)

func crashReading(i int) buckets.Reading {
	return reading(fmt.Sprintf("d%d", i%crashDevices), crashBase+buckets.Ticks(i/crashDevices)*buckets.TicksPerSecond, "n", i)
}

// crashBatch is write number b: 50 readings from 50*b, and a merge.
func crashBatch(b int) []buckets.Reading {
	var rs []buckets.Reading
	for i := 50 * b; i < 50*(b+1); i++ {
		rs = append(rs, crashReading(i))
	}
	if b%7 == 0 && b > 0 {
		old := crashReading(50*b - 70)
		rs = append(rs, reading(string(old.Device), old.Ticks, "m", b))
	}
	return rs
}

// parallelTests is -parallel when the command line does not set it.
// The parallel tests wait on the disk (fsyncs, Badger's opening and
// closing of tables) far more than they compute, so more of them run
// at once than the machine has cores. The tests that set the package's
// test hooks or bounds (compactnote_test.go, crash_test.go,
// overlap_test.go, settle_test.go, TestWriteBoundsDevicesTracked,
// TestSyncAllFsyncsEveryLog) or measure memory are not parallel: Go
// runs them alone, before every parallel test.
const parallelTests = "4"

// TestMain runs the crash child when asked to, and otherwise the
// package's tests, with -parallel at parallelTests unless the command
// line sets it.
func TestMain(m *testing.M) {
	if dir := os.Getenv(crashEnv); dir != "" {
		crashChild(dir)
		return
	}
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", parallelTests); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}

// crashChild writes batches from the one after the last acknowledged
// (argument file) until killed, printing "ack <b>" after each Write
// returns and "compacting" just before each compaction commits, which
// then waits a little so the parent's kill can land inside it.
func crashChild(dir string) {
	next, _ := strconv.Atoi(os.Getenv("STORE_CRASH_FROM"))
	var mu sync.Mutex // the compactor and the writer both print
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	testHookCompactCommit = func() {
		say("compacting")
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
	}
	o := DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Now = func() time.Time { return baseTime }
	o.CompactInterval = 5 * time.Millisecond
	s, err := Open(context.Background(), dir, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for b := next; ; b++ {
		if err := s.Write(context.Background(), crashBatch(b)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		say("ack %d", b)
		time.Sleep(time.Millisecond)
	}
}

// TestKillDuringCompaction SIGKILLs a process writing to a store while
// its compactions commit, again and again, restarting it from the last
// acknowledged write (as a redelivery would), and checks after each
// kill that every acknowledged reading is stored exactly as written.
func TestKillDuringCompaction(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	dir := t.TempDir()
	kills := 6
	if os.Getenv("TELEMETRY_LONG") == "1" {
		kills = 40
	}
	acked := -1
	for k := 0; k < kills; k++ {
		acked = crashRun(t, dir, acked+1, 3+k%4)
		verifyCrash(t, dir, acked)
	}
	require.GreaterOrEqual(t, acked, 3*kills, "the child made progress between kills")
	t.Logf("%d kills during compactions, %d writes acknowledged, all stored exactly", kills, acked+1)
}

// crashRun starts the child at batch from and kills it at its
// compactions-th compaction; it returns the last acknowledged batch.
func crashRun(t *testing.T, dir string, from, compactions int) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+dir, "STORE_CRASH_FROM="+strconv.Itoa(from))
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	acked := from - 1
	seen := 0
	sc := bufio.NewScanner(stdout)
	killed := false
	for sc.Scan() {
		line := sc.Text()
		if b, ok := strings.CutPrefix(line, "ack "); ok {
			acked, _ = strconv.Atoi(b)
			continue
		}
		if line == "compacting" && acked > from+2 {
			if seen++; seen == compactions {
				time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
				require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
				killed = true
				break
			}
		}
	}
	for sc.Scan() { // acks printed before the kill landed
		if b, ok := strings.CutPrefix(sc.Text(), "ack "); ok {
			acked, _ = strconv.Atoi(b)
		}
	}
	_ = cmd.Wait()
	require.True(t, killed, "the child stopped by itself: %s", stderr.String())
	return acked
}

// verifyCrash opens the store in dir and checks the readings of every
// batch up to acked. The batch after it may be stored too: the kill can
// land after its Write committed and before its ack was printed. Its
// new readings are then extra, and its merge (every seventh batch)
// may be in an acknowledged reading, which the next run writes again.
func verifyCrash(t *testing.T, dir string, acked int) {
	t.Helper()
	ts := openTestStore(t, dir, newTestClock())
	defer ts.Close()
	want := map[string]buckets.Reading{}
	for b := 0; b <= acked; b++ {
		for _, r := range crashBatch(b) {
			key := r.PartitionKey() + r.RowKey()
			if old, ok := want[key]; ok {
				r.Values = buckets.Merge(old.Values, r.Values)
			}
			want[key] = r
		}
	}
	inFlight := map[string]buckets.Reading{} // acknowledged readings as the unacknowledged batch would leave them
	for _, r := range crashBatch(acked + 1) {
		key := r.PartitionKey() + r.RowKey()
		if old, ok := want[key]; ok {
			r.Values = buckets.Merge(old.Values, r.Values)
			inFlight[key] = r
		}
	}
	got := 0
	for d := range crashDevices {
		dev := buckets.DeviceID(fmt.Sprintf("d%d", d))
		p, err := ts.Range(context.Background(), buckets.RangeQuery{Device: dev, From: 0, To: buckets.MaxTicks, Order: buckets.Asc, Limit: 1 << 20})
		require.NoError(t, err)
		for i, r := range p.Readings {
			if i > 0 {
				require.Greater(t, r.Ticks, p.Readings[i-1].Ticks, "each reading once")
			}
			w, ok := want[r.PartitionKey()+r.RowKey()]
			if !ok {
				continue // written but not acknowledged: the next run writes it again
			}
			got++
			if f, ok := inFlight[r.PartitionKey()+r.RowKey()]; ok && assert.ObjectsAreEqual(f, r) {
				continue // the unacknowledged batch's merge was committed
			}
			assert.Equal(t, w, r)
		}
	}
	assert.Equal(t, len(want), got, "every acknowledged reading is stored")
}

// TestVerifyCrashTakesTheUnacknowledgedBatch: a kill after batch 105's
// Write committed and before its ack leaves its merge in a reading of
// batch 103, which is acknowledged; the check accepts that state (the
// next run writes batch 105 again).
func TestVerifyCrashTakesTheUnacknowledgedBatch(t *testing.T) {
	dir := t.TempDir()
	ts := openTestStore(t, dir, newTestClock())
	for b := 0; b <= 105; b++ {
		ts.write(t, crashBatch(b)...)
	}
	require.NoError(t, ts.Close())
	verifyCrash(t, dir, 104)
}
