package badgeropts

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/store/versions"
)

// TestOpenPastEmptyFiles opens a table where a power cut left a
// write-ahead log and a value log file empty (created and sized, the
// size never synced): the open succeeds and what was synced before is
// there.
func TestOpenPastEmptyFiles(t *testing.T) {
	dir := t.TempDir()
	opts := For(dir, Hot, true, false, slog.New(slog.DiscardHandler))
	db, err := Open(opts)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(txn *badger.Txn) error { return txn.Set([]byte("k"), []byte("synced")) }))
	require.NoError(t, db.Close())
	cut := func() {
		for _, name := range []string{"00042.mem", "000042.vlog"} {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o644))
		}
	}
	cut()
	_, err = badger.Open(opts)
	require.ErrorContains(t, err, badgerNewFile, "Badger itself fails on the empty files")

	cut()
	db, err = Open(opts)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte("k"))
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		assert.Equal(t, "synced", string(v))
		return err
	}))
}

// TestOpenTablePastEmptyFiles: the same for a day table, which Badger
// opens in managed mode.
func TestOpenTablePastEmptyFiles(t *testing.T) {
	dir := t.TempDir()
	opts := For(dir, Hot, true, false, slog.New(slog.DiscardHandler))
	db, err := OpenManaged(opts)
	require.NoError(t, err)
	txn := db.NewTransactionAt(1, true)
	require.NoError(t, txn.Set([]byte("k"), []byte("synced")))
	require.NoError(t, txn.CommitAt(1, nil))
	require.NoError(t, db.Close())
	cut := func() {
		for _, name := range []string{"00042.mem", "000042.vlog"} {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o644))
		}
	}
	cut()
	_, err = badger.OpenManaged(opts)
	require.ErrorContains(t, err, badgerNewFile, "Badger itself fails on the empty files")

	cut()
	db, err = OpenManaged(opts)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, versions.ViewLatest(db, func(txn *badger.Txn) error {
		item, err := txn.Get([]byte("k"))
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		assert.Equal(t, "synced", string(v))
		return err
	}))
}
