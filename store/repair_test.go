package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/backup"
	"github.com/telemetryd/telemetryd/store/repair"
)

// RepairTable rebuilds a day from the sound blocks of its table and a
// backup: the corrupt block's readings come back from the backup, the
// readings written after the backup from the table, a newer value wins
// over the backup's, and the damaged directory is kept aside.
func TestRepairTableFromBlocksAndBackup(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	const dev = "dev-1"
	for w := range 3 { // one block per hour
		var rs []buckets.Reading
		for i := range 10 {
			rs = append(rs, reading(dev, at(time.Duration(w)*time.Hour+time.Duration(i)*time.Second), "n", w*10+i))
		}
		ts.write(t, rs...)
	}
	bdir := filepath.Join(t.TempDir(), "b")
	_, err := ts.Backup(ctx, bdir, backup.Options{})
	require.NoError(t, err)
	// After the backup: a newer value of a backed-up reading, and a new reading.
	ts.write(t, reading(dev, at(0), "n", 100), reading(dev, at(3*time.Hour), "n", 30))
	day := buckets.DayOf(at(0))
	require.NoError(t, ts.Close())
	editTable(t, ts.tableDir(day), func(key, v []byte, meta byte) ([]byte, byte) {
		if _, ref, _ := parseAnyBlockKey(key); ref.oldest == at(time.Hour) {
			v[len(v)/2] ^= 0x10
		}
		return v, meta
	})
	ts = ts.reopen(t)

	rep, err := ts.RepairTable(ctx, day, repair.Options{Backup: bdir})
	require.NoError(t, err)
	assert.Equal(t, 1, rep.BadBlocks)
	assert.Equal(t, int64(30), rep.FromBackup)
	assert.Empty(t, rep.SalvageErr)
	assert.Positive(t, rep.Salvaged)
	_, err = os.Stat(rep.Damaged)
	assert.NoError(t, err, "the damaged table is kept aside")

	page, err := ts.Range(ctx, buckets.RangeQuery{Device: dev, From: at(-time.Minute), To: at(4 * time.Hour), Limit: 100, Order: buckets.Asc})
	require.NoError(t, err)
	require.Len(t, page.Readings, 31, "three hours of ten, and the new one")
	got := map[buckets.Ticks]int64{}
	for _, r := range page.Readings {
		got[r.Ticks] = r.Values[0].Value.AsInt()
	}
	assert.Equal(t, int64(100), got[at(0)], "the newer value wins over the backup's")
	assert.Equal(t, int64(15), got[at(time.Hour+5*time.Second)], "the corrupt block's readings come from the backup")
	assert.Equal(t, int64(30), got[at(3*time.Hour)])
	assert.NoError(t, ts.CommitBlocked(ctx))
}
