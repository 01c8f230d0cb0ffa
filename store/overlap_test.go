package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// tableReadings is the reading count of the table of today.
func tableReadings(ts *testStore) int64 {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.tables[today].readings.Load()
}

// Readings older than what was written for their device, but outside
// every time written for it (the messages of two line protocol requests
// in flight, the later one first), are written without reading the
// device's blocks first; a reading within them is read and merged.
func TestOlderRunIsNotReadBack(t *testing.T) {
	ts := newTestStore(t)
	reads := 0
	testHookReadBeforeWrite = func() { reads++ }
	t.Cleanup(func() { testHookReadBeforeWrite = nil })
	k0 := at(-2 * time.Hour)
	ts.write(t, series("dev", k0+10*buckets.TicksPerSecond, time.Second, 10)...) // 10..19 s
	ts.write(t, series("dev", k0, time.Second, 10)...)                           // 0..9 s
	ts.write(t, series("dev", k0+30*buckets.TicksPerSecond, time.Second, 10)...) // 30..39 s
	ts.write(t, series("dev", k0+20*buckets.TicksPerSecond, time.Second, 5)...)  // 20..24 s
	assert.Zero(t, reads, "no write could merge into a stored reading")
	assert.EqualValues(t, 35, tableReadings(ts))

	ts.write(t, reading("dev", k0+5*buckets.TicksPerSecond, "x", 1.5)) // merges into 5 s
	assert.Equal(t, 1, reads)
	ts.write(t, reading("dev", k0+25*buckets.TicksPerSecond, "x", 2.5)) // the gap 25..29 s
	assert.Equal(t, 1, reads)
	assert.EqualValues(t, 36, tableReadings(ts))
	got, err := ts.Get(t.Context(), "dev", k0+5*buckets.TicksPerSecond)
	require.NoError(t, err)
	assert.Equal(t, reading("dev", k0+5*buckets.TicksPerSecond, "n", 5, "x", 1.5), got)
}

// An open block that overlaps another (the second half of a reading
// whose first half an earlier commit wrote) is merged with the block it
// overlaps, from the device's note, not with every open block of the
// device, and the merged reading holds both halves.
func TestOverlapMergesOnlyTheBlocksItOverlaps(t *testing.T) {
	ts := newTestStore(t, func(o *Options) { o.CompactInterval = time.Hour })
	listings := 0
	testHookListBlocks = func() { listings++ }
	t.Cleanup(func() { testHookListBlocks = nil })
	k0 := windowStart(at(-3 * time.Hour))
	for i := range 5 { // five open blocks of three readings
		ts.write(t, series("dev", k0+buckets.Ticks(i*3)*buckets.TicksPerSecond, time.Second, 3)...)
	}
	last := k0 + 14*buckets.TicksPerSecond
	ts.write(t, reading("dev", last, "half", true))
	require.Len(t, blocksOf(t, ts, today, "dev"), 6)

	ts.compact(false)
	refs := blocksOf(t, ts, today, "dev")
	require.Len(t, refs, 5, "the two overlapping blocks merged, the others left alone: %+v", refs)
	assert.Equal(t, 3, refs[0].count)
	assert.Equal(t, last, refs[0].newest)
	for i := range refs {
		for j := range refs {
			assert.False(t, i != j && refs[i].overlaps(refs[j]), "%+v overlaps %+v", refs[i], refs[j])
		}
	}
	assert.Zero(t, listings, "merged from the note")
	got, err := ts.Get(t.Context(), "dev", last)
	require.NoError(t, err)
	assert.Equal(t, reading("dev", last, "half", true, "n", 2), got)
	assert.EqualValues(t, 15, tableReadings(ts))
}

// The second half of a reading, written after the commit that wrote
// its first half as the device's newest reading, merges without reading
// the device's blocks back: the write tracker keeps that reading. Past
// the tracker's bound it is read back; either way the stored reading
// holds both halves, and a device's deletion leaves nothing behind.
func TestSecondHalfMergesWithoutReadingBack(t *testing.T) {
	keptAndPastTheBound(t, func(t *testing.T, ts *testStore, reads *int, want int) {
		k := at(-time.Hour)
		ts.write(t, reading("truck", k-10*buckets.TicksPerSecond, "velocity", 3.0), reading("truck", k, "velocity", 4.0))
		ts.write(t, reading("truck", k, "status", 1))
		assert.Equal(t, want, *reads)
		got, err := ts.Get(t.Context(), "truck", k)
		require.NoError(t, err)
		assert.Equal(t, reading("truck", k, "status", 1, "velocity", 4.0), got)
		assert.EqualValues(t, 2, tableReadings(ts))

		// The merged reading is kept in turn: a third part merges
		// into both.
		ts.write(t, reading("truck", k, "load", 7))
		got, err = ts.Get(t.Context(), "truck", k)
		require.NoError(t, err)
		assert.Equal(t, reading("truck", k, "load", 7, "status", 1, "velocity", 4.0), got)
	})
}

// The messages of two requests in flight may commit in the other
// order: the second half of a reading (with the readings after it)
// first, then the older message that ends with its first half. The
// older one merges into the oldest reading the tracker kept of the
// newer write, without reading the block back.
func TestFirstHalfAfterTheSecondMergesWithoutReadingBack(t *testing.T) {
	keptAndPastTheBound(t, func(t *testing.T, ts *testStore, reads *int, want int) {
		k, step := at(-time.Hour), buckets.Ticks(10*buckets.TicksPerSecond)
		ts.write(t, reading("truck", k, "status", 1), reading("truck", k+step, "status", 0, "velocity", 5.0))
		ts.write(t, reading("truck", k-step, "status", 0, "velocity", 3.0), reading("truck", k, "velocity", 4.0))
		assert.Equal(t, want, *reads)
		got, err := ts.Get(t.Context(), "truck", k)
		require.NoError(t, err)
		assert.Equal(t, reading("truck", k, "status", 1, "velocity", 4.0), got)
		assert.EqualValues(t, 3, tableReadings(ts))

		// A later write at the kept oldest reading's ticks replaces
		// it: the next part merges into what the table holds.
		ts.write(t, reading("truck", k, "load", 7))
		got, err = ts.Get(t.Context(), "truck", k)
		require.NoError(t, err)
		assert.Equal(t, reading("truck", k, "load", 7, "status", 1, "velocity", 4.0), got)
	})
}

// keptAndPastTheBound runs fn on a new store twice: with the write
// tracker's bound on kept readings as it is (want 0 reads before a
// write) and at 0, past it (want 1), counting the reads in reads.
func keptAndPastTheBound(t *testing.T, fn func(t *testing.T, ts *testStore, reads *int, want int)) {
	for _, tc := range []struct {
		name  string
		bound int
		reads int
	}{{"kept", maxLastBytes, 0}, {"past the bound", 0, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			bound := maxLastBytes
			maxLastBytes = tc.bound
			t.Cleanup(func() { maxLastBytes = bound })
			ts := newTestStore(t)
			reads := 0
			testHookReadBeforeWrite = func() { reads++ }
			t.Cleanup(func() { testHookReadBeforeWrite = nil })
			fn(t, ts, &reads, tc.reads)
		})
	}
}

// After a commit fails, which may have left its blocks, the reading the
// write tracker kept for its devices is not used: the next part of it
// is read back.
func TestKeptReadingDroppedAfterFailedCommit(t *testing.T) {
	ts := newTestStore(t)
	reads := 0
	testHookReadBeforeWrite = func() { reads++ }
	t.Cleanup(func() { testHookReadBeforeWrite = nil })
	k := at(-time.Hour)
	ts.write(t, reading("truck", k, "velocity", 4.0))
	ts.mu.Lock()
	tb := ts.tables[today]
	ts.mu.Unlock()
	tb.writeMu.Lock()
	tb.doubt([]entry{{dev: "truck"}}) // as commitChunk does when a commit fails
	tb.writeMu.Unlock()
	ts.write(t, reading("truck", k, "status", 1))
	assert.Equal(t, 1, reads)
	got, err := ts.Get(t.Context(), "truck", k)
	require.NoError(t, err)
	assert.Equal(t, reading("truck", k, "status", 1, "velocity", 4.0), got)
}
