package store

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/versions"
)

// Table metadata keys. Keys starting with 0x00 are metadata; no device
// ID can start with it. Both are updated in the transaction that writes
// the readings, so they are exact after any crash.
var (
	// metaReadingsKey holds the number of distinct readings (8 bytes
	// big-endian).
	metaReadingsKey = []byte("\x00meta/readings")
	// metaNewestKey holds the newest ticks stored in the table (8 bytes
	// big-endian). A reading newer than that cannot exist yet, so
	// writing it needs no read of the old value.
	metaNewestKey = []byte("\x00meta/newest")
	// metaFormatKey holds the format version of the table (one byte),
	// written with the first commit.
	metaFormatKey = []byte("\x00meta/format")
)

// formatVersion is the table format this build writes and reads:
// readings kept as blocks of package block, keyed as series.go says.
// Version 1 (no format key) kept one Badger entry per reading.
const formatVersion = 2

// table is one day table: a Badger database that is opened lazily and
// may be closed and reopened while the store runs. Each opening is a
// reference-counted handle (handle.go): every read and write holds a
// reference for as long as it uses db, and the handle's last reference
// closes the database, so a table is closed or dropped only when no
// reference is held.
//
// A cold table (a day that is not hot) opened for a read is opened
// read-only: Badger then runs no compactions and writes nothing, so
// closing it, as a drop does, never waits for a compaction. A write to
// it reopens it writable once the readers holding it are done.
type table struct {
	day buckets.Day
	dir string
	bad *badBlocks // where readers report blocks they skip (series.go)

	// readings is the exact number of readings, or -1 when it is not
	// known: the table was not opened in this process and has no count
	// file (package countfile). Writers update it under writeMu.
	readings atomic.Int64
	// writeMu serializes writers, which makes read-modify-write (the
	// merge of readings with the same key) safe without Badger's
	// conflict detection.
	writeMu sync.Mutex
	// newest is the newest ticks stored (metaNewestKey), -1 for none.
	// Set when db opens, then guarded by writeMu.
	newest buckets.Ticks
	// wt is what this process wrote since db was opened (write.go).
	// Guarded by writeMu.
	wt writeTracker
	// ver numbers commits and tracks readers' versions (package
	// versions: the database is opened in managed mode, so queries
	// never wait for writers). Readers call ver.ReadTxn, writers
	// ver.Reserve and ver.WriteTxn, then commitTxnAt (write.go).
	ver versions.Versions
	// countFile says that the count file exists: it must be removed
	// before the next commit. Guarded by writeMu.
	countFile bool
	// lastCommit is when the table was last written to in this
	// process, by the store's clock. Guarded by writeMu.
	lastCommit time.Time
	// formatSaved says that the table records its format version.
	// Guarded by writeMu.
	formatSaved bool
	// comp is what the compactor has to look at (compact.go). Guarded
	// by writeMu.
	comp compactState
	// commits counts the commits of readings (beforeCommit). Guarded by
	// writeMu.
	commits uint64
	// settled says that an idle close of the open database leaves
	// nothing undone (settle.go). Set by the compactor under writeMu,
	// cleared by every commit of readings and every opening.
	settled atomic.Bool

	// Guarded by Store.mu. db, hot and readOnly describe the open
	// database: the handle live set them when it opened it and clears
	// them when it ends, and a holder of a reference to live may read
	// them without the lock.
	db       *badger.DB
	gen      uint64    // numbers the opening of db among all the store's openings
	hot      bool      // db was opened with hot options
	readOnly bool      // db was opened read-only
	cur      *handle   // the handle new references go to; nil if none
	live     *handle   // the handle whose database is open (db)
	last     *handle   // the newest handle; the next one opens after it ended
	dropping bool      // DropTable is under way: route nothing new here
	lastUsed time.Time // when the last reference was taken or released
	useSeq   uint64    // Store.useSeq at that moment: orders tables for LRU
	failErr  error     // why the last open failed
	failedAt time.Time // when it failed
}

// access says what a caller wants a table for.
type access uint8

const (
	forRead  access = iota // a missing or dropping table reads as empty
	forWrite               // a missing table is created; a dropping one is unavailable
)
