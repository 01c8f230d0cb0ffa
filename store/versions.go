package store

import (
	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/store/versions"
)

// A day table's commits are numbered by package versions (its database
// is opened in managed mode, so queries never wait for writers).

// readTxn starts a read-only transaction of t at the last completed
// commit; done discards it. A reference to t must be held until done.
func (t *table) readTxn() (txn *badger.Txn, done func()) { return t.ver.ReadTxn(t.db) }

// commitTxn commits txn, a write transaction of t, as the next version
// and publishes it to readers once it completed. It must run under
// t.writeMu. A failed commit uses up its version.
func (t *table) commitTxn(txn *badger.Txn) error {
	return t.commitTxnAt(txn, t.reserveVersion())
}

// reserveVersion takes the version of the next commit, for a writer
// that needs it before committing (block keys hold it). It must run
// under t.writeMu, and the version must go to commitTxnAt.
func (t *table) reserveVersion() uint64 { return t.ver.Reserve(t.db) }

// commitTxnAt commits txn as version, from reserveVersion, and
// publishes it to readers once it completed.
func (t *table) commitTxnAt(txn *badger.Txn, version uint64) error {
	if testHookTableWrite != nil {
		testHookTableWrite("commit")
	}
	return t.ver.CommitAt(t.db, txn, version)
}

// writeTxn starts a write transaction of t, for commitTxn.
func (t *table) writeTxn() *badger.Txn { return t.ver.WriteTxn(t.db) }

// viewLatest runs f in a read-only transaction at the newest version of
// db, for reads while nothing writes (opening, rebuilding the index).
func viewLatest(db *badger.DB, f func(txn *badger.Txn) error) error {
	return versions.ViewLatest(db, f)
}
