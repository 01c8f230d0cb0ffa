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
	t.Parallel()
	ts := newTestStore(t)
	k := at(-time.Minute)
	ts.write(t, reading("dev", k, "a", 1))
	h, err := ts.acquire(context.Background(), today, forRead)
	require.NoError(t, err)
	defer ts.release(h)

	before, doneBefore := h.ver.ReadTxn(h.db)
	defer doneBefore()
	ts.write(t, reading("dev", k, "b", 2))
	after, doneAfter := h.ver.ReadTxn(h.db)
	defer doneAfter()

	assert.Equal(t, reading("dev", k, "a", 1), getAt(t, before, "dev", k))
	assert.Equal(t, reading("dev", k, "a", 1, "b", 2), getAt(t, after, "dev", k))
}

// A reader's view stays the same while commits and compactions go on.
func TestReaderViewSurvivesCommitsAndCompaction(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	k := at(-time.Minute)
	ts.write(t, reading("dev", k, "a", 1))
	ts = ts.reopen(t) // the first version is now in an SSTable
	h, err := ts.acquire(context.Background(), today, forRead)
	require.NoError(t, err)
	defer ts.release(h)

	old, done := h.ver.ReadTxn(h.db)
	defer done()
	ts.write(t, reading("dev", k, "b", 2))
	ts.write(t, reading("other", k, "x", 1))
	require.NoError(t, h.db.Flatten(1))
	assert.Equal(t, reading("dev", k, "a", 1), getAt(t, old, "dev", k))
}

// A commit that only deletes leaves no key at its version once
// compaction dropped the deletions with what they deleted. The versions
// of the table must still go on above it after a reopen: an incremental
// backup taken at that commit copies the entries above its version, and
// would miss commits that were given it again.
func TestVersionsGoOnAboveADeletionOnlyCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestStore(t)
	ts.write(t, series("a", dayTick(today, time.Hour), time.Second, 3)...)
	ts.write(t, series("b", dayTick(today, time.Hour), time.Second, 3)...)
	tb, err := ts.acquire(ctx, today, forWrite)
	require.NoError(t, err)
	tb.writeMu.Lock()
	var keys [][]byte
	txn, done := tb.ver.ReadTxn(tb.db)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: devicePrefix("b")})
	for it.Rewind(); it.Valid(); it.Next() {
		keys = append(keys, it.Item().KeyCopy(nil))
	}
	it.Close()
	done()
	require.NotEmpty(t, keys)
	wtxn := tb.ver.WriteTxn(tb.db)
	for _, k := range keys {
		require.NoError(t, wtxn.Delete(k))
	}
	require.NoError(t, tb.commitTxn(wtxn))
	deleted := tb.ver.Last()
	tb.writeMu.Unlock()
	ts.release(tb)

	ts = ts.reopen(t) // closing compacts level 0: the deletions go with the blocks
	tb, err = ts.acquire(ctx, today, forWrite)
	require.NoError(t, err)
	defer ts.release(tb)
	tb.writeMu.Lock()
	defer tb.writeMu.Unlock()
	assert.Greater(t, tb.ver.Reserve(tb.db), deleted)
}
