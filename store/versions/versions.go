// Package versions numbers the commits of a day table's Badger
// database, opened in managed mode, and tracks the versions its readers
// use.
//
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
// MetaCommitKey, so that version is always the last commit's: a commit
// that only deleted would otherwise leave no key at its version once
// compaction dropped the deletions with what they deleted, and after a
// reopen its version would be given out again, to commits an
// incremental backup taken at it would never copy.
package versions

import (
	"sync"

	"github.com/dgraph-io/badger/v4"
)

// MetaCommitKey is written, empty, by every commit of a table.
var MetaCommitKey = []byte("\x00meta/commit")

// Versions numbers the commits of one opening of a table's database and
// tracks the versions its readers use. It is reset when the database is
// opened again. The zero value is ready.
type Versions struct {
	mu      sync.Mutex
	db      *badger.DB     // the opening it describes
	last    uint64         // version of the last commit that completed
	next    uint64         // version of the next commit
	readers map[uint64]int // versions read at, with their reader counts
}

// syncLocked resets v for db when db is a new opening. v.mu is held.
func (v *Versions) syncLocked(db *badger.DB) {
	if v.db != db {
		v.db, v.last = db, db.MaxVersion()
		v.next, v.readers = v.last+1, make(map[uint64]int)
	}
}

// ReadTxn starts a read-only transaction of db at the last completed
// commit; done discards it.
func (v *Versions) ReadTxn(db *badger.DB) (txn *badger.Txn, done func()) {
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

// Reserve takes the version of the next commit to db. Writers are
// serialized by the caller, and the version must go to CommitAt.
func (v *Versions) Reserve(db *badger.DB) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.syncLocked(db)
	version := v.next
	v.next++
	return version
}

// CommitAt commits txn, a write transaction of db, as version, from
// Reserve, and publishes it to readers once it completed.
func (v *Versions) CommitAt(db *badger.DB, txn *badger.Txn, version uint64) error {
	if err := txn.Set(MetaCommitKey, nil); err != nil {
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
func (v *Versions) completedLocked(version uint64) (discard uint64) {
	v.last, discard = version, version
	for at := range v.readers {
		discard = min(discard, at)
	}
	return discard
}

// Last is the version of the last completed commit.
func (v *Versions) Last() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.last
}

// WriteTxn starts a write transaction of db, for CommitAt.
func (v *Versions) WriteTxn(db *badger.DB) *badger.Txn {
	v.mu.Lock()
	v.syncLocked(db)
	at := v.last
	v.mu.Unlock()
	return db.NewTransactionAt(at, true)
}

// ViewLatest runs f in a read-only transaction at the newest version of
// db, for reads while nothing writes (opening, rebuilding the index).
func ViewLatest(db *badger.DB, f func(txn *badger.Txn) error) error {
	txn := db.NewTransactionAt(db.MaxVersion(), false)
	defer txn.Discard()
	return f(txn)
}
