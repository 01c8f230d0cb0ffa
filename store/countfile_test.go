package store

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/countfile"
)

// countFile reads the count file of day's table: -1 when there is none.
func (ts *testStore) countFile(t *testing.T, day buckets.Day) int64 {
	t.Helper()
	n, ok, err := countfile.Read(ts.tableDir(day))
	require.NoError(t, err)
	if !ok {
		return -1
	}
	return n
}

// openTables is what the telemetry.store.open_tables gauge reports.
func openTablesGauge(t *testing.T, r *sdkmetric.ManualReader) int64 {
	t.Helper()
	return gaugeValue(t, collectMetrics(t, r), "telemetry.store.open_tables")
}

// withMeter gives the store a meter provider read by the returned reader.
func withMeter() (func(*Options), *sdkmetric.ManualReader) {
	r := sdkmetric.NewManualReader()
	return func(o *Options) { o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(r)) }, r
}

func TestTablesAfterCleanRestartOpenNoTable(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	ts.write(t, series("a", dayTick(today-20, time.Hour), time.Second, 300)...)
	ts.write(t, series("a", dayTick(today-3, time.Hour), time.Second, 100)...)
	ts.write(t, series("b", dayTick(today-3, time.Hour), time.Second, 7)...)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 40)...)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 40)...) // redelivery
	ts.write(t, reading("a", dayTick(today, time.Hour), "extra", true))     // merge
	want := map[buckets.Day]int64{today - 20: 300, today - 3: 107, today: 40}

	meter, reader := withMeter()
	ts = ts.reopen(t, meter)
	for d, n := range want {
		assert.Equal(t, n, ts.countFile(t, d), "a clean close saves the count of %s", d)
	}
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, want, countsOf(tables))
	assert.Zero(t, openTablesGauge(t, reader), "listing the tables opens none of them")
	for d := range want {
		assert.False(t, ts.isOpen(d))
	}

	// A drop right after the restart reports the exact count and opens
	// nothing either.
	drop, err := ts.DropTable(ctx, today-20)
	require.NoError(t, err)
	assert.Equal(t, int64(300), drop.Readings)
	assert.Zero(t, openTablesGauge(t, reader))
	assert.NoDirExists(t, ts.tableDir(today-20))
}

func TestTablesAfterUncleanStopReportUnknownAndOpenNothing(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	ts.write(t, series("a", dayTick(today-5, time.Hour), time.Second, 50)...)
	ts.write(t, series("a", dayTick(today-4, time.Hour), time.Second, 60)...)
	ts = ts.reopen(t)
	require.Equal(t, int64(60), ts.countFile(t, today-4))

	// Writing removes the count file first: a crash from now on leaves
	// no stale count behind.
	ts.write(t, reading("a", dayTick(today-4, 2*time.Hour), "v", 1))
	assert.Equal(t, int64(-1), ts.countFile(t, today-4), "the first commit removes the count file")
	assert.Equal(t, int64(50), ts.countFile(t, today-5), "a table nobody wrote keeps its count file")

	// The process dies: copy the data directory as it is now, open
	// Badger databases and all.
	crashed := t.TempDir()
	copyTree(t, ts.dir, crashed)
	meter, reader := withMeter()
	cs := openTestStore(t, crashed, ts.clock, func(o *Options) { *o = ts.opts }, meter)
	tables, err := cs.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[buckets.Day]int64{today - 5: 50, today - 4: -1}, countsOf(tables),
		"a table written when the process died has no known count")
	assert.Zero(t, openTablesGauge(t, reader), "an unknown count does not open the table")

	// Reading the day opens it (writable: Badger must replay its log)
	// and makes the count known again; closing it saves it.
	got, err := cs.Get(ctx, "a", dayTick(today-4, 2*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, reading("a", 0, "v", 1).Values, got.Values)
	tables, err = cs.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[buckets.Day]int64{today - 5: 50, today - 4: 61}, countsOf(tables))
	cs = cs.reopen(t)
	assert.Equal(t, int64(61), cs.countFile(t, today-4))
}

// copyTree copies the regular files under src to dst, leaving holes
// where src has zero blocks (Badger preallocates large sparse files).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		return copySparse(p, filepath.Join(dst, rel))
	}))
}

func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	buf, zero := make([]byte, 64<<10), make([]byte, 64<<10)
	var size int64
	for {
		n, err := io.ReadFull(in, buf)
		if n > 0 {
			if bytes.Equal(buf[:n], zero[:n]) {
				_, err = out.Seek(int64(n), io.SeekCurrent)
			} else {
				_, err = out.Write(buf[:n])
			}
			if err != nil {
				return err
			}
			size += int64(n)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return out.Truncate(size)
		}
		if err != nil {
			return err
		}
	}
}

func TestCountsStayExactAcrossMergesRedeliveriesAndDrops(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	old := today - 6
	ts.write(t, series("a", dayTick(old, time.Hour), time.Minute, 30)...)
	ts.write(t, series("a", dayTick(old-1, time.Hour), time.Minute, 5)...)
	ts = ts.reopen(t)

	steps := []struct {
		name     string
		rs       []buckets.Reading
		readings int64
		fileKept bool
	}{
		{"redelivery changes nothing", series("a", dayTick(old, time.Hour), time.Minute, 30), 30, true},
		{"merge into stored readings", []buckets.Reading{reading("a", dayTick(old, time.Hour), "extra", 1)}, 30, false},
		{"new readings and merges", series("a", dayTick(old, time.Hour+20*time.Minute), time.Minute, 20), 40, false},
	}
	for _, st := range steps {
		ts.write(t, st.rs...)
		tables, err := ts.Tables(ctx)
		require.NoError(t, err)
		assert.Equal(t, st.readings, countsOf(tables)[old], st.name)
		if st.fileKept {
			assert.Equal(t, st.readings, ts.countFile(t, old), st.name)
		} else {
			assert.Equal(t, int64(-1), ts.countFile(t, old), st.name)
		}
		ts = ts.reopen(t)
		assert.Equal(t, st.readings, ts.countFile(t, old), "%s: saved at close", st.name)
		tables, err = ts.Tables(ctx)
		require.NoError(t, err)
		assert.Equal(t, map[buckets.Day]int64{old - 1: 5, old: st.readings}, countsOf(tables), st.name)
	}

	drop, err := ts.DropTable(ctx, old)
	require.NoError(t, err)
	assert.Equal(t, int64(40), drop.Readings)
	// A write after the drop starts a fresh table and a fresh count.
	ts.write(t, reading("a", dayTick(old, time.Hour), "v", 1))
	ts = ts.reopen(t)
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[buckets.Day]int64{old - 1: 5, old: 1}, countsOf(tables))
}

func TestQuietTableSavesItsCountUntilTheNextWrite(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t, func(o *Options) { o.IdleClose = 40 * time.Millisecond })
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 25)...)
	require.Equal(t, int64(-1), ts.countFile(t, today))

	ts.clock.Advance(countQuiet - time.Nanosecond)
	ts.saveQuietCounts()
	assert.Equal(t, int64(-1), ts.countFile(t, today), "written less than countQuiet ago")

	ts.clock.Advance(time.Nanosecond)
	require.Eventually(t, func() bool { return ts.countFile(t, today) == 25 }, 5*time.Second, 5*time.Millisecond,
		"the janitor saves the count of a table not written for countQuiet")
	assert.True(t, ts.isOpen(today), "the table stays open")

	ts.write(t, reading("a", dayTick(today, 2*time.Hour), "v", 1))
	assert.Equal(t, int64(-1), ts.countFile(t, today), "the next write removes it")
}

func TestMalformedCountFileIsIgnored(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	d := today - 4
	ts.write(t, series("a", dayTick(d, time.Hour), time.Second, 12)...)
	require.NoError(t, ts.Close())
	require.NoError(t, os.WriteFile(filepath.Join(ts.tableDir(d), countfile.FileName), []byte("12 readings\n"), 0o644))

	ts = ts.reopen(t)
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(-1), countsOf(tables)[d])
	assert.NoFileExists(t, filepath.Join(ts.tableDir(d), countfile.FileName), "removed on open")

	_, err = ts.Latest(ctx, "a", 1)
	require.NoError(t, err)
	ts = ts.reopen(t)
	assert.Equal(t, int64(12), ts.countFile(t, d), "the next clean close writes it again")
}

func TestColdTableOpenedForReadIsReadOnly(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	cold := today - 5
	ts.write(t, series("a", dayTick(cold, time.Hour), time.Second, 10)...)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 10)...)
	ts = ts.reopen(t)
	before := dirSnapshot(t, ts.tableDir(cold))

	_, err := ts.Get(ctx, "a", dayTick(cold, time.Hour))
	require.NoError(t, err)
	_, err = ts.Get(ctx, "a", dayTick(today, time.Hour))
	require.NoError(t, err)
	ts.mu.Lock()
	coldRO, hotRO := ts.tables[cold].readOnly, ts.tables[today].readOnly
	ts.mu.Unlock()
	assert.True(t, coldRO, "a cold table opened for a read is read-only: no compactions for a drop to wait for")
	assert.False(t, hotRO, "a hot table opens writable")
	assert.Equal(t, before, dirSnapshot(t, ts.tableDir(cold)), "reading a cold table changes nothing on disk")

	_, err = ts.DropTable(ctx, cold)
	require.NoError(t, err)
	assert.NoDirExists(t, ts.tableDir(cold))
}

func TestWriteToReadOnlyTableReopensItAfterReaders(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	cold := today - 5
	ts.write(t, series("a", dayTick(cold, time.Hour), time.Second, 10)...)
	ts = ts.reopen(t)
	h, err := ts.acquire(ctx, cold, forRead)
	require.NoError(t, err)
	require.True(t, h.readOnly)

	wrote := make(chan error, 1)
	go func() { wrote <- ts.Write(ctx, []buckets.Reading{reading("a", dayTick(cold, 2*time.Hour), "v", 1)}) }()
	read := make(chan error, 1)
	require.Eventually(t, func() bool { return ts.reopening(cold) }, 5*time.Second, time.Millisecond,
		"the writer waits to reopen the table")
	go func() {
		_, err := ts.Get(ctx, "a", dayTick(cold, time.Hour))
		read <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("write finished while a reader held the read-only table: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	// The holder can still read.
	out, err := scanTable(ctx, h, "a", cold.Start(), cold.End(), buckets.Desc, 100, nil, nil)
	require.NoError(t, err)
	assert.Len(t, out, 10)

	ts.release(h)
	require.NoError(t, <-wrote)
	require.NoError(t, <-read, "a reader that came during the reopen gets the writable table")
	ts.mu.Lock()
	ro := ts.tables[cold].readOnly
	ts.mu.Unlock()
	assert.False(t, ro)
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(11), countsOf(tables)[cold])

	// A writer whose context ends while it waits gives up cleanly.
	ts = ts.reopen(t)
	h, err = ts.acquire(ctx, cold, forRead)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	err = ts.Write(wctx, []buckets.Reading{reading("a", dayTick(cold, 3*time.Hour), "v", 1)})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	ts.release(h)
	ts.write(t, reading("a", dayTick(cold, 3*time.Hour), "v", 1))
	got, err := ts.Latest(ctx, "a", 100)
	require.NoError(t, err)
	assert.Len(t, got, 12)
}

func TestColdTableThatCannotOpenReadOnlyOpensWritable(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	d := today - 5
	ts.write(t, reading("a", at(0), "v", 1)) // the index is not empty: no rebuild at Open
	// A crash right after the directory of a new table was made.
	require.NoError(t, os.MkdirAll(ts.tableDir(d), 0o755))
	ts = ts.reopen(t)
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[buckets.Day]int64{d: -1, today: 1}, countsOf(tables))

	h, err := ts.acquire(ctx, d, forRead)
	require.NoError(t, err, "a directory without a MANIFEST cannot open read-only")
	assert.False(t, h.readOnly)
	ts.release(h)
	tables, err = ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[buckets.Day]int64{d: 0, today: 1}, countsOf(tables))
}
