package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// noteWorkload drives a store the way a fleet does, with the odd late,
// repeated and out-of-order reading, and compactions in between. Each
// step is a function of the step's random numbers only, so two stores
// given the same seed see the same writes and compactions.
type noteWorkload struct {
	rng  *rand.Rand
	next map[string]buckets.Ticks // next in-order reading per device
	// big: now and then a batch of hundreds or thousands of readings,
	// so that merges cut full blocks (maxBlockReadings) that are sealed
	// while older open blocks remain.
	big bool
}

func newNoteWorkload(seed uint64, big bool) *noteWorkload {
	return &noteWorkload{rng: rand.New(rand.NewPCG(seed, 7)), next: map[string]buckets.Ticks{}, big: big}
}

// step returns the readings to write next, or nil and whether to
// compact (full or not) instead.
func (w *noteWorkload) step() (rs []buckets.Reading, compact, full bool) {
	sec := buckets.Ticks(buckets.TicksPerSecond)
	dev := fmt.Sprintf("dev%d", w.rng.IntN(5))
	if _, ok := w.next[dev]; !ok {
		w.next[dev] = at(-10 * time.Hour)
	}
	switch p := w.rng.IntN(100); {
	case p < 93: // in order, now and then a gap into a later window
		if w.rng.IntN(200) == 0 {
			w.next[dev] += buckets.Ticks(time.Hour / 100)
		}
		n := 1 + w.rng.IntN(3)
		if w.big && w.rng.IntN(60) == 0 {
			n = []int{250, 3000}[w.rng.IntN(2)]
		}
		for range n {
			rs = append(rs, reading(dev, w.next[dev], "a", w.rng.IntN(1000), "b", float64(w.rng.IntN(100))/10))
			w.next[dev] += sec
		}
		return rs, false, false
	case p < 94: // late: anywhere before the next in-order reading
		k := at(-10*time.Hour) + buckets.Ticks(w.rng.Int64N(int64(w.next[dev]-at(-10*time.Hour)+1)))
		return []buckets.Reading{reading(dev, k, "late", w.rng.IntN(1000))}, false, false
	case p < 95: // the latest reading again, changed
		k := w.next[dev] - sec
		return []buckets.Reading{reading(dev, k, "a", w.rng.IntN(1000))}, false, false
	default:
		return nil, true, w.rng.IntN(20) == 0
	}
}

// tableDump renders every key and value of the table of day.
func tableDump(t *testing.T, ts *testStore, day buckets.Day) string {
	t.Helper()
	var b strings.Builder
	viewTable(t, ts, day, func(txn *badger.Txn) {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			require.NoError(t, err)
			fmt.Fprintf(&b, "%q=%x meta %d\n", it.Item().Key(), v, it.Item().UserMeta())
		}
	})
	return b.String()
}

// openBlocksOf lists the open blocks of dev, as keys sort.
func openBlocksOf(t *testing.T, ts *testStore, dev buckets.DeviceID) []blockRef {
	var open []blockRef
	for _, r := range blocksOf(t, ts, today, dev) {
		if !r.sealed {
			open = append(open, r)
		}
	}
	return open
}

// checkNotes checks that every exact note lists exactly the open blocks
// of its device, and that in a table that knows its devices, a device
// without a note has no open block.
func checkNotes(t *testing.T, ts *testStore, devs []string) (exact int) {
	t.Helper()
	ts.mu.Lock()
	tb := ts.tables[today]
	ts.mu.Unlock()
	tb.writeMu.Lock()
	listed, held := 0, 0
	for _, n := range tb.comp.notes {
		listed += len(n.open)
		for _, b := range n.open {
			held += len(b.value)
		}
	}
	assert.Equal(t, tb.comp.listed, listed, "blocks listed")
	assert.Equal(t, tb.comp.held, held, "value bytes kept")
	assert.LessOrEqual(t, listed, maxKnownBlocks)
	assert.LessOrEqual(t, held, maxHeldValueBytes)
	notes := make(map[buckets.DeviceID][]keyedRef)
	known := tb.comp.known
	for _, d := range devs {
		n := tb.comp.notes[buckets.DeviceID(d)]
		switch {
		case n == nil && known:
			notes[buckets.DeviceID(d)] = []keyedRef{}
		case n != nil && n.exact: // urgent or not, it lists every open block
			refs := []keyedRef{}
			for _, b := range n.open {
				refs = append(refs, keyedRef{blockRef: b.ref, key: appendBlockKey(nil, buckets.DeviceID(d), b.ref)})
			}
			slices.SortFunc(refs, func(a, b keyedRef) int { return strings.Compare(string(a.key), string(b.key)) })
			notes[buckets.DeviceID(d)] = refs
		}
	}
	tb.writeMu.Unlock()
	for dev, refs := range notes {
		var listed []blockRef
		for _, r := range refs {
			listed = append(listed, r.blockRef)
		}
		require.Equal(t, openBlocksOf(t, ts, dev), listed, "note of %s", dev)
		exact++
	}
	return exact
}

// An exact note lists every open block of its device, through ordinary,
// late and repeated writes, compactions, and a reopening of the table.
func TestExactNotesListEveryOpenBlock(t *testing.T) {
	ts := newTestStore(t, func(o *Options) { o.CompactInterval = time.Hour })
	devs := []string{"dev0", "dev1", "dev2", "dev3", "dev4"}
	w := newNoteWorkload(1, true)
	checked := 0
	for i := range 3000 {
		if i == 1500 {
			ts = ts.reopen(t)
		}
		rs, compact, full := w.step()
		if compact {
			ts.compact(full)
		} else {
			ts.write(t, rs...)
		}
		if i%25 == 0 {
			checked += checkNotes(t, ts, devs)
		}
	}
	assert.Greater(t, checked, 300, "exact notes checked")
}

// A compaction that takes its blocks from the notes leaves the table
// byte for byte as one that lists them from the keys, and most
// compactions take them from the notes: with every value kept, with
// some read back from the table (past maxHeldValueBytes), and with
// notes made inexact past maxKnownBlocks.
func TestCompactionFromNotesMatchesListing(t *testing.T) {
	blocks, held := maxKnownBlocks, maxHeldValueBytes
	t.Cleanup(func() { maxKnownBlocks, maxHeldValueBytes = blocks, held })
	for _, c := range []struct {
		name             string
		blocks, held     int
		big              bool
		minShareFromKeys int // listings without notes per listing with them
	}{
		{"values kept", blocks, held, false, 2},
		{"values read back", blocks, 2000, false, 2},
		{"few blocks listed", 30, held, false, 1},
		{"full blocks sealed among open ones", blocks, held, true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			maxKnownBlocks, maxHeldValueBytes = c.blocks, c.held
			compareWithListing(t, c.blocks, c.big, c.minShareFromKeys)
		})
	}
}

// compareWithListing runs the same workload on a store whose notes
// list at most bound blocks and on one whose notes list none.
func compareWithListing(t *testing.T, bound int, big bool, minShare int) {
	quiet := func(o *Options) { o.CompactInterval = time.Hour }
	fromNotes, fromKeys := newTestStore(t, quiet), newTestStore(t, quiet)
	listings := 0
	testHookListBlocks = func() { listings++ }
	t.Cleanup(func() { testHookListBlocks = nil })

	wa, wb := newNoteWorkload(2, big), newNoteWorkload(2, big)
	compactions, listedFromNotes, listedFromKeys := 0, 0, 0
	for i := range 6000 {
		for _, s := range []struct {
			ts    *testStore
			w     *noteWorkload
			bound int
		}{{fromNotes, wa, bound}, {fromKeys, wb, 0}} {
			maxKnownBlocks = s.bound
			before := listings
			rs, compact, full := s.w.step()
			if !compact {
				s.ts.write(t, rs...)
				continue
			}
			s.ts.compact(full)
			if s.ts == fromNotes {
				compactions++
				listedFromNotes += listings - before
			} else {
				listedFromKeys += listings - before
			}
		}
		if i%50 == 0 {
			maxKnownBlocks = bound
			checkNotes(t, fromNotes, []string{"dev0", "dev1", "dev2", "dev3", "dev4"})
		}
	}
	maxKnownBlocks = bound
	require.Equal(t, wa.next, wb.next)
	for dev, k := range wa.next {
		require.Equal(t, today, buckets.DayOf(k), "%s stays in one day", dev)
	}
	require.Equal(t, tableDump(t, fromKeys, today), tableDump(t, fromNotes, today))
	for _, d := range []buckets.DeviceID{"dev0", "dev1", "dev2", "dev3", "dev4"} {
		assert.Equal(t, answers(t, fromKeys, d), answers(t, fromNotes, d))
	}
	assert.Greater(t, compactions, 200)
	t.Logf("devices compacted from their keys: %d with notes, %d without", listedFromNotes, listedFromKeys)
	assert.Greater(t, listedFromKeys, minShare*listedFromNotes, "most compactions take their blocks from the notes")
}

// A merge of open blocks can leave an open block that spans a sealed
// block it did not take (the first 4096 readings of a merge are cut
// into a full, sealed block). Listing the keys then finds the overlap
// and merges the sealed block in; a note must not merge the open
// blocks without it.
func TestNoteLeavesOpenBlockSpanningSealedToListing(t *testing.T) {
	quiet := func(o *Options) { o.CompactInterval = time.Hour }
	fromNotes, fromKeys := newTestStore(t, quiet), newTestStore(t, quiet)
	bound := maxKnownBlocks
	t.Cleanup(func() { maxKnownBlocks = bound })
	both := func(f func(ts *testStore)) {
		maxKnownBlocks = bound
		f(fromNotes)
		maxKnownBlocks = 0
		f(fromKeys)
		maxKnownBlocks = bound
	}
	k0 := windowStart(at(-3 * time.Hour))
	step := buckets.Ticks(buckets.TicksPerSecond * 3 / 10)
	run := func(from, n int) []buckets.Reading {
		rs := make([]buckets.Reading, n)
		for i := range rs {
			rs[i] = reading("dev", k0+buckets.Ticks(from+i)*step, "v", from+i)
		}
		return rs
	}
	both(func(ts *testStore) {
		ts.write(t, run(0, 3000)...)    // X1, tier 2
		ts.write(t, run(3000, 3000)...) // X2, tier 2
		for i := range 20 {             // 20 blocks of tier 1
			ts.write(t, run(6000+250*i, 250)...)
		}
		ts.compact(false)                                   // S: 6000..10095 sealed (full), Y: 10096..10999 open
		ts.write(t, reading("dev", k0+10999*step, "v", -1)) // repeated: urgent
		ts.compact(false)                                   // 0..4095 sealed; 4096..5999 with 10096..10999 open, spanning S
		for i := range compactTierBlocks {
			ts.write(t, run(11000+i, 1)...)
		}
		ts.compact(false)
	})
	var spanning bool
	refs := blocksOf(t, fromKeys, today, "dev")
	for _, r := range refs {
		for _, o := range refs {
			spanning = spanning || (r != o && r.overlaps(o))
		}
	}
	assert.False(t, spanning, "listing merged the sealed block in: %+v", refs)
	require.Equal(t, tableDump(t, fromKeys, today), tableDump(t, fromNotes, today))
	assert.Equal(t, answers(t, fromKeys, "dev"), answers(t, fromNotes, "dev"))
}

// After a failed commit (which may have left blocks that only the next
// commit makes visible), a listing makes no exact note until a commit
// succeeds.
func TestNoExactNoteFromListingAfterFailedCommit(t *testing.T) {
	ts := newTestStore(t, func(o *Options) { o.CompactInterval = time.Hour })
	k0 := at(-time.Hour)
	sec := buckets.Ticks(buckets.TicksPerSecond)
	for i := range compactTierBlocks {
		ts.write(t, reading("dev", k0+buckets.Ticks(i)*sec, "v", i))
	}
	ts.mu.Lock()
	tb := ts.tables[today]
	ts.mu.Unlock()
	exact := func() bool {
		tb.writeMu.Lock()
		defer tb.writeMu.Unlock()
		n := tb.comp.notes["dev"]
		return n != nil && n.exact
	}
	require.True(t, exact())

	tb.writeMu.Lock()
	tb.doubt([]entry{{dev: "dev"}}) // as commitChunk does when a commit fails
	tb.writeMu.Unlock()
	require.False(t, exact())
	ts.compact(false) // lists, merging the 16 blocks
	require.Len(t, openBlocksOf(t, ts, "dev"), 1)
	assert.False(t, exact(), "a listing before the next successful commit")

	for i := range compactTierBlocks {
		ts.write(t, reading("dev", k0+buckets.Ticks(100+i)*sec, "v", i))
	}
	ts.compact(false) // lists after successful commits
	assert.True(t, exact(), "a listing after a successful commit")
	checkNotes(t, ts, []string{"dev"})
}

// TestCompactionGoesOnPastAFailingDevice: a device whose blocks cannot
// be merged (one does not decode) is left as it is, without an error
// or a retry at every compaction (the corrupt block is reported
// instead), and does not keep the devices after it from being merged.
func TestCompactionGoesOnPastAFailingDevice(t *testing.T) {
	ts := newTestStore(t, func(o *Options) { o.CompactInterval = time.Hour })
	k0 := at(-time.Hour)
	sec := buckets.Ticks(buckets.TicksPerSecond)
	for i := range compactTierBlocks {
		ts.write(t, reading("a", k0+buckets.Ticks(i)*sec, "v", i), reading("b", k0+buckets.Ticks(i)*sec, "v", i))
	}
	ts.mu.Lock()
	tb := ts.tables[today]
	ts.mu.Unlock()
	bad := openBlocksOf(t, ts, "a")[3]
	tb.writeMu.Lock()
	txn := tb.ver.WriteTxn(tb.db)
	require.NoError(t, txn.Set(appendBlockKey(nil, "a", bad), []byte("not a block")))
	require.NoError(t, tb.commitTxn(txn))
	tb.doubt([]entry{{dev: "a"}}) // the blocks are read from the table, not from the note
	tb.writeMu.Unlock()

	require.NoError(t, ts.compactTable(tb, false))
	assert.Len(t, openBlocksOf(t, ts, "b"), 1, "b, after the failing a, was merged")
	assert.Len(t, openBlocksOf(t, ts, "a"), compactTierBlocks, "a was left as it was")
	tb.writeMu.Lock()
	noted := tb.comp.notes["a"] != nil
	tb.writeMu.Unlock()
	assert.False(t, noted, "a is not tried again until it is written to")
	rep, err := ts.Check(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, rep.Blocks, 1)
	assert.Equal(t, appendBlockKey(nil, "a", bad), rep.Blocks[0].Key)
}
