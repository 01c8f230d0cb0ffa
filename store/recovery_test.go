package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/badgeropts"
)

// After a crash, RecountUnknown makes the count of a table that was
// being written known again (and saved) without a query opening it.
func TestRecountUnknownAfterUncleanStop(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	ts.write(t, series("a", dayTick(today-5, time.Hour), time.Second, 50)...)
	ts.write(t, series("a", dayTick(today-4, time.Hour), time.Second, 60)...)
	ts = ts.reopen(t)
	ts.write(t, reading("a", dayTick(today-4, 2*time.Hour), "v", 1))
	crashed := t.TempDir()
	copyTree(t, ts.dir, crashed)
	cs := openTestStore(t, crashed, ts.clock, func(o *Options) { *o = ts.opts })
	tables, err := cs.Tables(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(-1), countsOf(tables)[today-4])

	require.NoError(t, cs.RecountUnknown(ctx))
	tables, err = cs.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[buckets.Day]int64{today - 5: 50, today - 4: 61}, countsOf(tables))
	assert.Equal(t, int64(61), cs.countFile(t, today-4), "saved: known after the next crash too")

	// A read-only store does nothing.
	ro := cs.reopen(t, func(o *Options) { o.ReadOnly = true })
	require.NoError(t, ro.RecountUnknown(ctx))
}

// A read-only store (a retention dry run beside a stopped service)
// reads a table that was not closed cleanly, without changing it.
func TestReadOnlyStoreOpensTableNotClosedCleanly(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	ts.write(t, series("a", dayTick(today-4, time.Hour), time.Second, 60)...)
	ts = ts.reopen(t)
	ts.write(t, reading("a", dayTick(today-4, 2*time.Hour), "v", 1))
	crashed := t.TempDir()
	copyTree(t, ts.dir, crashed)
	require.False(t, badgeropts.ClosedCleanly(filepath.Join(crashed, tablesDirName, (today-4).String())))
	before := treeDigest(t, crashed)

	ro := openTestStore(t, crashed, ts.clock, func(o *Options) { *o = ts.opts; o.ReadOnly = true })
	got, err := ro.Get(ctx, "a", dayTick(today-4, 2*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, reading("a", 0, "v", 1).Values, got.Values)
	page, err := ro.Range(ctx, buckets.RangeQuery{Device: "a", From: dayTick(today-4, 0), To: dayTick(today-3, 0), Order: buckets.Asc, Limit: 1000})
	require.NoError(t, err)
	assert.Len(t, page.Readings, 61)
	tables, err := ro.Tables(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(61), countsOf(tables)[today-4])
	require.NoError(t, ro.Close())
	assert.Equal(t, before, treeDigest(t, crashed), "a read-only store changes nothing on disk")
}

// treeDigest maps every regular file under dir (but the LOCK file) to
// the SHA-256 of its content.
func treeDigest(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "LOCK" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = hex.EncodeToString(sum[:])
		return nil
	}))
	return out
}
