package store

import (
	"context"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// getAt reads the reading at key k of dev with txn.
func getAt(t *testing.T, txn *badger.Txn, dev buckets.DeviceID, k buckets.Ticks) buckets.Reading {
	t.Helper()
	r, ok, err := getReading(context.Background(), &table{}, txn, dev, k)
	require.NoError(t, err)
	require.True(t, ok, "no reading at %d", k)
	return r
}

// A reader reads at the last completed commit: what commits after it
// started stays invisible to it, and the next reader sees it.
func TestReadersSeeCompletedCommits(t *testing.T) {
	ts := newTestStore(t)
	k := at(-time.Minute)
	ts.write(t, reading("dev", k, "a", 1))
	h, err := ts.acquire(context.Background(), today, forRead)
	require.NoError(t, err)
	defer ts.release(h)

	before, doneBefore := h.readTxn()
	defer doneBefore()
	ts.write(t, reading("dev", k, "b", 2))
	after, doneAfter := h.readTxn()
	defer doneAfter()

	assert.Equal(t, reading("dev", k, "a", 1), getAt(t, before, "dev", k))
	assert.Equal(t, reading("dev", k, "a", 1, "b", 2), getAt(t, after, "dev", k))
}

// A reader's view stays the same while commits and compactions go on.
func TestReaderViewSurvivesCommitsAndCompaction(t *testing.T) {
	ts := newTestStore(t)
	k := at(-time.Minute)
	ts.write(t, reading("dev", k, "a", 1))
	ts = ts.reopen(t) // the first version is now in an SSTable
	h, err := ts.acquire(context.Background(), today, forRead)
	require.NoError(t, err)
	defer ts.release(h)

	old, done := h.readTxn()
	defer done()
	ts.write(t, reading("dev", k, "b", 2))
	ts.write(t, reading("other", k, "x", 1))
	require.NoError(t, h.db.Flatten(1))
	assert.Equal(t, reading("dev", k, "a", 1), getAt(t, old, "dev", k))
}

// Compaction may drop overwritten versions up to the oldest version a
// reader uses, or up to the last commit when nobody reads.
func TestDiscardVersionFollowsReaders(t *testing.T) {
	v := versions{readers: map[uint64]int{}}
	assert.Equal(t, uint64(7), v.completedLocked(7), "no readers")
	assert.Equal(t, uint64(7), v.last)
	v.readers[7], v.readers[9] = 1, 2
	assert.Equal(t, uint64(7), v.completedLocked(10), "the oldest reader's version")
	assert.Equal(t, uint64(10), v.last)
	delete(v.readers, 7)
	assert.Equal(t, uint64(9), v.completedLocked(11))
}
