package store

import (
	"fmt"
	"sync"

	"github.com/dgraph-io/badger/v4"
)

// Day tables are Badger databases in managed mode: the store numbers
// the commits of a table itself (writers are serialized per table
// anyway), and a reader reads at the version of the last commit that
// completed. An ordinary Badger read transaction instead waits until
// every commit that has been given a timestamp is applied, so under a
// steady stream of large ingest commits every query waited for the
// commit in flight, and for memtable flushes when a commit had to wait
// for room; in managed mode queries never wait for writers.
//
// Badger keeps every version newer than the discard version; the store
// moves it up to the oldest version a reader still uses after each
// commit, so compaction keeps dropping overwritten versions.

// A table's versions go on after a reopen from the newest version its
// database holds (DB.MaxVersion). Every commit also writes
// metaCommitKey, so that version is always the last commit's: a commit
// that only deleted would otherwise leave no key at its version once
// compaction dropped the deletions with what they deleted, and after a
// reopen its version would be given out again, to commits an
// incremental backup taken at it would never copy.

// metaCommitKey is written, empty, by every commit of a table.
var metaCommitKey = []byte("\x00meta/commit")

// versions numbers the commits of one opening of a table's database and
// tracks the versions its readers use. It is reset when the database is
// opened again.
type versions struct {
	mu      sync.Mutex
	db      *badger.DB     // the opening it describes
	last    uint64         // version of the last commit that completed
	next    uint64         // version of the next commit
	readers map[uint64]int // versions read at, with their reader counts
}

// syncLocked resets v for db when db is a new opening. v.mu is held.
func (v *versions) syncLocked(db *badger.DB) {
	if v.db != db {
		v.db, v.last = db, db.MaxVersion()
		v.next, v.readers = v.last+1, make(map[uint64]int)
	}
}

// readTxn starts a read-only transaction of t at the last completed
// commit; done discards it. A reference to t must be held until done.
func (t *table) readTxn() (txn *badger.Txn, done func()) {
	v, db := &t.ver, t.db
	v.mu.Lock()
	v.syncLocked(db)
	at := v.last
	v.readers[at]++
	v.mu.Unlock()
	txn = db.NewTransactionAt(at, false)
	return txn, func() {
		txn.Discard()
		v.mu.Lock()
		if v.db == db {
			if v.readers[at]--; v.readers[at] <= 0 {
				delete(v.readers, at)
			}
		}
		v.mu.Unlock()
	}
}

// commitTxn commits txn, a write transaction of t, as the next version
// and publishes it to readers once it completed. It must run under
// t.writeMu. A failed commit uses up its version.
func (t *table) commitTxn(txn *badger.Txn) error {
	return t.commitTxnAt(txn, t.reserveVersion())
}

// reserveVersion takes the version of the next commit, for a writer
// that needs it before committing (block keys hold it). It must run
// under t.writeMu, and the version must go to commitTxnAt.
func (t *table) reserveVersion() uint64 {
	v := &t.ver
	v.mu.Lock()
	defer v.mu.Unlock()
	v.syncLocked(t.db)
	version := v.next
	v.next++
	return version
}

// commitTxnAt commits txn as version, from reserveVersion, and
// publishes it to readers once it completed.
func (t *table) commitTxnAt(txn *badger.Txn, version uint64) error {
	v, db := &t.ver, t.db
	if testHookTableWrite != nil {
		testHookTableWrite("commit")
	}
	if err := txn.Set(metaCommitKey, nil); err != nil {
		return err
	}
	if err := txn.CommitAt(version, nil); err != nil {
		return err
	}
	v.mu.Lock()
	discard := v.completedLocked(version)
	v.mu.Unlock()
	db.SetDiscardTs(discard)
	return nil
}

// completedLocked publishes version as the last completed commit and
// returns the version at or below which compaction may drop overwritten
// versions: the oldest one a reader uses, else version. v.mu is held.
func (v *versions) completedLocked(version uint64) (discard uint64) {
	v.last, discard = version, version
	for at := range v.readers {
		discard = min(discard, at)
	}
	return discard
}

// writeTxn starts a write transaction of t, for commitTxn.
func (t *table) writeTxn() *badger.Txn {
	v, db := &t.ver, t.db
	v.mu.Lock()
	v.syncLocked(db)
	at := v.last
	v.mu.Unlock()
	return db.NewTransactionAt(at, true)
}

// viewLatest runs f in a read-only transaction at the newest version of
// db, for reads while nothing writes (opening, rebuilding the index).
func viewLatest(db *badger.DB, f func(txn *badger.Txn) error) error {
	txn := db.NewTransactionAt(db.MaxVersion(), false)
	defer txn.Discard()
	return f(txn)
}

// openTableBadger opens a day table's database in managed mode, with
// panics turned into errors, past the empty files a power cut can leave
// (openSizingEmptyFiles).
func openTableBadger(opts badger.Options) (db *badger.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("badger panicked: %v", r)
		}
	}()
	return openSizingEmptyFiles(opts, badger.OpenManaged)
}
