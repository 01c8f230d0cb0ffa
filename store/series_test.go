package store

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
)

// render prints readings exactly (float bits included), so that two
// answers compare byte for byte.
func render(rs []buckets.Reading) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%s %s %s", r.PartitionKey(), r.RowKey(), r.Ticks.FormatTime())
		for _, f := range r.Values {
			v := f.Value
			switch v.Kind {
			case buckets.KindFloat:
				fmt.Fprintf(&b, " %s=f:%x", f.Name, math.Float64bits(v.AsFloat()))
			default:
				fmt.Fprintf(&b, " %s=%s:%v", f.Name, v.Kind, v.Any())
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// compact runs the compactor over every writable table now.
func (ts *testStore) compact(full bool) { ts.compactAll(full) }

// viewTable runs fn on a read transaction of the table of day.
func viewTable(t *testing.T, ts *testStore, day buckets.Day, fn func(txn *badger.Txn)) {
	t.Helper()
	h, err := ts.acquire(context.Background(), day, forRead)
	require.NoError(t, err)
	require.NotNil(t, h)
	defer ts.release(h)
	txn, done := h.ver.ReadTxn(h.db)
	defer done()
	fn(txn)
}

// blocksOf lists the blocks of dev in the table of day.
func blocksOf(t *testing.T, ts *testStore, day buckets.Day, dev buckets.DeviceID) []blockRef {
	t.Helper()
	var refs []blockRef
	viewTable(t, ts, day, func(txn *badger.Txn) {
		require.NoError(t, eachBlock(txn, dev, 0, func(bi blockItem) (bool, error) {
			refs = append(refs, bi.ref)
			return true, nil
		}))
	})
	return refs
}

// answers is everything the store answers about dev, rendered.
func answers(t *testing.T, ts *testStore, dev buckets.DeviceID) string {
	t.Helper()
	ctx := context.Background()
	latest, err := ts.Latest(ctx, dev, 1000)
	require.NoError(t, err)
	asc, err := ts.Range(ctx, buckets.RangeQuery{Device: dev, From: 0, To: buckets.MaxTicks, Order: buckets.Asc, Limit: 1000})
	require.NoError(t, err)
	var gets []buckets.Reading
	for _, r := range asc.Readings {
		g, err := ts.Get(ctx, dev, r.Ticks)
		require.NoError(t, err)
		gets = append(gets, g)
	}
	return "latest\n" + render(latest) + "asc\n" + render(asc.Readings) + "get\n" + render(gets)
}

func TestSameKeyMergesAcrossOpenAndSealedBlocks(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	k := at(-3 * time.Hour)
	sec := buckets.Ticks(buckets.TicksPerSecond)
	ts.write(t, reading("dev", k, "a", 1), reading("dev", k+sec, "a", 2))
	ts.write(t, reading("dev", k, "b", true))             // a second open block
	ts.write(t, reading("dev", k+sec, "a", 3.5))          // a third, overwriting a
	ts.write(t, reading("dev", at(-time.Minute), "z", 0)) // a newer window
	require.Greater(t, len(blocksOf(t, ts, today, "dev")), 3, "open blocks, one per write")
	want := []buckets.Reading{reading("dev", k, "a", 1, "b", true), reading("dev", k+sec, "a", 3.5)}
	page, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: k, To: k + 2*sec, Order: buckets.Asc, Limit: 10})
	require.NoError(t, err)
	assert.Equal(t, want, page.Readings, "merged across open blocks")

	ts.compact(false)
	refs := blocksOf(t, ts, today, "dev")
	require.Len(t, refs, 2, "one sealed block for the old window, one open block for the newest")
	assert.True(t, refs[1].sealed)
	assert.False(t, refs[0].sealed)
	page, err = ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: k, To: k + 2*sec, Order: buckets.Asc, Limit: 10})
	require.NoError(t, err)
	assert.Equal(t, want, page.Readings, "the same after compaction")

	ts.write(t, reading("dev", k, "c", "late")) // merges into a sealed block
	got, err := ts.Get(ctx, "dev", k)
	require.NoError(t, err)
	assert.Equal(t, reading("dev", k, "a", 1, "b", true, "c", "late"), got)
	ts.compact(true)
	got, err = ts.Get(ctx, "dev", k)
	require.NoError(t, err)
	assert.Equal(t, reading("dev", k, "a", 1, "b", true, "c", "late"), got)
	for _, r := range blocksOf(t, ts, today, "dev") {
		for _, o := range blocksOf(t, ts, today, "dev") {
			if r != o {
				assert.False(t, r.overlaps(o), "compacted blocks never overlap")
			}
		}
	}
	tables, err := ts.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(3), tables[0].Readings)
}

func TestRedeliveryBeforeAndAfterCompactionGivesIdenticalAnswers(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	k := at(-2 * time.Hour)
	msg := series("dev", k, 10*time.Second, 100)
	msg = append(msg, reading("dev", k, "extra", "x")) // a same-key merge inside the message
	ts.write(t, msg...)
	first := answers(t, ts, "dev")
	raw := rawTable(t, ts, today)

	ts.write(t, msg...)
	assert.Equal(t, first, answers(t, ts, "dev"), "redelivered before compaction")
	assert.Equal(t, raw, rawTable(t, ts, today), "a redelivery writes nothing")

	ts.compact(true)
	assert.Equal(t, first, answers(t, ts, "dev"), "after compaction")
	ts.write(t, msg...)
	assert.Equal(t, first, answers(t, ts, "dev"), "redelivered after compaction")
	ts = ts.reopen(t)
	ts.write(t, msg...)
	assert.Equal(t, first, answers(t, ts, "dev"), "redelivered after a restart")
	tables, err := ts.Tables(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(100), tables[0].Readings)
}

func TestOutOfOrderAndLateReadings(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	step := buckets.Ticks(10 * buckets.TicksPerSecond)
	k0 := at(-5 * time.Hour)
	var want []buckets.Reading
	for i := range 2000 {
		want = append(want, reading("dev", k0+buckets.Ticks(i)*step, "n", i))
	}
	// Batches in shuffled order, every fifth batch arriving after a
	// compaction sealed the windows around it.
	order := []int{3, 0, 7, 1, 9, 4, 2, 8, 5, 6}
	for j, b := range order {
		ts.write(t, want[b*200:(b+1)*200]...)
		if j%5 == 4 {
			ts.compact(false)
		}
	}
	check := func(what string) {
		page, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: 0, To: buckets.MaxTicks, Order: buckets.Asc, Limit: 5000})
		require.NoError(t, err)
		require.Equal(t, render(want), render(page.Readings), what)
		latest, err := ts.Latest(ctx, "dev", 7)
		require.NoError(t, err)
		assert.Equal(t, reversed(want[len(want)-7:]), latest, what)
	}
	check("open and sealed blocks mixed")
	ts.compact(true)
	check("after a full compaction")
	for _, r := range blocksOf(t, ts, today, "dev") {
		assert.Equal(t, windowStart(r.oldest), windowStart(r.newest), "a block stays in its window")
	}
}

// Cursors page through every reading exactly once while compactions
// and merging writes run.
func TestCursorsExactlyOnceWhileCompacting(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t, func(o *Options) { o.CompactInterval = time.Millisecond })
	ctx := context.Background()
	step := buckets.Ticks(buckets.TicksPerSecond)
	k0 := at(-4 * time.Hour)
	n := 3000
	for i := 0; i < n; i += 30 { // one small block per write
		ts.write(t, series("dev", k0+buckets.Ticks(i)*step, time.Second, 30)...)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // rewrites old readings (new blocks overlapping old ones) and compacts
		defer wg.Done()
		for i := 0; ; i = (i + 37) % n {
			select {
			case <-stop:
				return
			default:
			}
			if err := ts.Write(ctx, []buckets.Reading{reading("dev", k0+buckets.Ticks(i)*step, "m", i)}); err != nil {
				t.Error(err)
				return
			}
			ts.compact(i%3 == 0)
		}
	}()
	for _, order := range []buckets.Order{buckets.Asc, buckets.Desc} {
		for round := 0; round < 3; round++ {
			seen := map[buckets.Ticks]int{}
			var after *buckets.Ticks
			var prev buckets.Ticks = -1
			for {
				p, err := ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: k0, To: k0 + buckets.Ticks(n)*step,
					Order: order, Limit: 47, After: after})
				require.NoError(t, err)
				for _, r := range p.Readings {
					seen[r.Ticks]++
					if prev >= 0 {
						require.Equal(t, order == buckets.Asc, r.Ticks > prev, "in order")
					}
					prev = r.Ticks
				}
				if !p.More {
					break
				}
				last := p.Readings[len(p.Readings)-1].Ticks
				after = &last
			}
			require.Len(t, seen, n, "every reading")
			for k, c := range seen {
				require.Equal(t, 1, c, "reading %d seen once", k)
			}
		}
	}
	close(stop)
	wg.Wait()
}

func TestUnknownTableFormatFailsThatDayOnly(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	old := today - 3
	ts.write(t, reading("dev", dayTick(old, time.Hour), "v", 1))
	ts.write(t, reading("dev", at(-time.Hour), "v", 2))
	h, err := ts.acquire(ctx, old, forWrite)
	require.NoError(t, err)
	h.writeMu.Lock()
	txn := h.ver.WriteTxn(h.db)
	require.NoError(t, txn.Set(metaFormatKey, []byte{9}))
	require.NoError(t, h.commitTxn(txn))
	h.writeMu.Unlock()
	ts.release(h)
	ts = ts.reopen(t)

	_, err = ts.Range(ctx, buckets.RangeQuery{Device: "dev", From: 0, To: buckets.MaxTicks, Order: buckets.Asc, Limit: 10})
	require.ErrorIs(t, err, buckets.ErrUnavailable)
	var te *buckets.TableError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, old, te.Day)
	assert.Contains(t, te.ClientMessage(), old.String())
	assert.Contains(t, te.ClientMessage(), "format version 9")
	latest, err := ts.Latest(ctx, "dev", 1)
	require.NoError(t, err, "other days are unaffected")
	assert.Equal(t, []buckets.Reading{reading("dev", at(-time.Hour), "v", 2)}, latest)
}

func TestTableOfOneEntryPerReadingIsRefusedByName(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	old := today - 2
	ts.write(t, reading("dev", dayTick(old, time.Hour), "v", 1))
	h, err := ts.acquire(ctx, old, forWrite)
	require.NoError(t, err)
	h.writeMu.Lock()
	txn := h.ver.WriteTxn(h.db)
	require.NoError(t, txn.Delete(metaFormatKey))
	require.NoError(t, h.commitTxn(txn))
	h.writeMu.Unlock()
	ts.release(h)
	ts = ts.reopen(t)
	_, err = ts.Get(ctx, "dev", dayTick(old, time.Hour))
	require.ErrorIs(t, err, buckets.ErrUnavailable)
	assert.Contains(t, err.Error(), old.String())
	assert.Contains(t, err.Error(), "format version 1")
}

// A table whose oldest file had bits flipped where its format key lies
// still reads its count from a newer file, so it looks like a table of
// format version 1 (readings, no version). Its files' checksums tell
// the two apart: it is refused as damaged, with the advice to repair
// it, not as a table of another build.
func TestDamagedFormatKeyIsDamageNotAnOldFormat(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	old := today - 2
	ts.write(t, reading("dev", dayTick(old, time.Hour), "v", 1))
	for i := range 300 { // enough for more than one block
		ts.write(t, series(fmt.Sprintf("dev-%03d", i), dayTick(old, time.Duration(i)*time.Second), time.Minute, 100)...)
	}
	ts = ts.reopen(t) // the table file: its format key and count
	ts.write(t, reading("dev", dayTick(old, 2*time.Hour), "v", 2))
	// The write-ahead log holds the count again: copied as a crash
	// leaves it.
	crashed := t.TempDir()
	require.NoError(t, os.CopyFS(crashed, os.DirFS(ts.dir)))
	ssts, err := filepath.Glob(filepath.Join(TableDir(crashed, old), "*.sst"))
	require.NoError(t, err)
	require.Len(t, ssts, 1)
	flipByte(t, ssts[0], 40) // inside its first block, where the metadata keys sort

	ts = openTestStore(t, crashed, ts.clock, func(o *Options) { *o = ts.opts })
	_, err = ts.Get(ctx, "dev", dayTick(old, time.Hour))
	require.ErrorIs(t, err, buckets.ErrUnavailable)
	assert.Contains(t, err.Error(), old.String())
	assert.NotContains(t, err.Error(), "format version")
	assert.Contains(t, err.Error(), "damaged")
	assert.Contains(t, err.Error(), "repair")
}

// flipByte inverts the byte at off of the file at path.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	b := []byte{0}
	_, err = f.ReadAt(b, off)
	require.NoError(t, err)
	b[0] ^= 0xff
	_, err = f.WriteAt(b, off)
	require.NoError(t, err)
}

func TestCompactionCountsAndKeysAfterCleanClose(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	k0 := dayTick(today, 0)
	for i := 0; i < 8640; i += 100 { // a day at 10 s, 100 readings per commit
		ts.write(t, series("dev", k0+buckets.Ticks(i)*10*buckets.TicksPerSecond, 10*time.Second, 100)...)
	}
	ts = ts.reopen(t) // Close merges every open block
	refs := blocksOf(t, ts, today, "dev")
	assert.Len(t, refs, 24, "one block per hour")
	total := 0
	for _, r := range refs {
		total += r.count
		assert.Equal(t, windowStart(r.oldest), windowStart(r.newest))
	}
	assert.Equal(t, 8640, total)
	// Keys other than blocks and metadata do not exist.
	for _, it := range rawTable(t, ts, today) {
		if it.key[0] == 0 {
			continue
		}
		_, _, ok := parseAnyBlockKey([]byte(it.key))
		assert.True(t, ok, "key %x", it.key)
	}
}

// TestSmallOpenBlocksAreWrittenUncompressed checks which open blocks a
// commit writes without zstd: those of the lowest size tier, which the
// compactor merges again soon, and no larger one.
func TestSmallOpenBlocksAreWrittenUncompressed(t *testing.T) {
	t.Parallel()
	for _, n := range []int{8, compactTierBlocks - 1, compactTierBlocks, 100} {
		rs := series("dev-1", at(0), 10*time.Second, n)
		for i := range rs {
			for k := range 10 {
				rs[i].Values = append(rs[i].Values, buckets.Field{Name: fmt.Sprintf("v%d", k), Value: buckets.Float(float64(i*k) / 7)})
			}
		}
		got, err := encodeOpen(rs)
		require.NoError(t, err)
		plain, err := block.EncodePlain(nil, rs)
		require.NoError(t, err)
		packed, err := block.Encode(nil, rs)
		require.NoError(t, err)
		require.NotEqual(t, plain, packed, "%d readings: zstd must make a difference for the check to mean anything", n)
		if n < compactTierBlocks {
			assert.Equal(t, plain, got, "%d readings", n)
		} else {
			assert.Equal(t, packed, got, "%d readings", n)
		}
	}
}
