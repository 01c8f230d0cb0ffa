package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/badgeropts"
	"github.com/telemetryd/telemetryd/store/blocked"
	"github.com/telemetryd/telemetryd/store/repair"
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
	bad *badBlocks // where readers report blocks they skip (corrupt.go)

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

func newTable(day buckets.Day, dir string, bad *badBlocks) *table {
	t := &table{day: day, dir: dir, bad: bad}
	t.readings.Store(-1)
	return t
}

// access says what a caller wants a table for.
type access uint8

const (
	forRead  access = iota // a missing or dropping table reads as empty
	forWrite               // a missing table is created; a dropping one is unavailable
)

// unavailableTable is the error of a table that cannot be opened.
func unavailableTable(day buckets.Day, err error) error {
	var fe *formatError
	if errors.As(err, &fe) {
		return &buckets.TableError{Day: day, Reason: fmt.Sprintf("has table format version %s, which this build does not read (it reads version %d); other days are unaffected", fe.version, formatVersion), Err: err}
	}
	return &buckets.TableError{Day: day, Reason: "cannot be opened (damaged?); other days are unaffected; " + blocked.RepairAdvice(day), Err: err}
}

// openTableDB opens the Badger database of t and reads its metadata.
// Unless writable, it is opened read-only if it was closed cleanly
// (else Badger must replay and truncate its write-ahead log, which
// needs write access); a read-only store opens it read-only always.
// Badger panics on some kinds of damage; that is turned into an error
// so one damaged day cannot take the process down.
func (s *Store) openTableDB(t *table, hot, writable bool) (db *badger.DB, readOnly bool, meta tableMeta, err error) {
	class := badgeropts.Cold
	if hot {
		class = badgeropts.Hot
	}
	readOnly = !writable && (s.opts.ReadOnly || badgeropts.ClosedCleanly(t.dir))
	opts := badgeropts.For(t.dir, class, s.opts.SyncWrites, readOnly, s.log.With("day", t.day.String())).
		WithIndexCacheSize(s.opts.IndexCacheSize)
	if hot {
		opts = opts.WithMemTableSize(s.opts.MemTableSize).WithBlockCacheSize(s.opts.BlockCacheSize).
			WithValueThreshold(min(badgeropts.ValueThreshold, s.opts.MemTableSize/8))
	}
	if err := repair.CheckFiles(t.dir, opts); err != nil {
		return nil, false, meta, err
	}
	db, err = badgeropts.OpenView(opts, badgeropts.OpenManaged)
	if err != nil && readOnly && !s.opts.ReadOnly {
		// Such as a directory whose creation a crash interrupted: a
		// writable open completes what it can.
		s.log.Debug("opening day table read-only failed; opening it writable", "day", t.day.String(), "err", err)
		readOnly = false
		db, err = badgeropts.OpenManaged(opts.WithReadOnly(false))
	}
	if err != nil {
		return nil, false, meta, err
	}
	if meta, err = readMeta(db); err != nil {
		_ = db.Close()
		return nil, false, meta, err
	}
	return db, readOnly, meta, nil
}

// tableMeta is the metadata of a day table.
type tableMeta struct {
	readings int64
	newest   buckets.Ticks
	format   byte // 0: not recorded yet (a new table)
}

// readMeta reads the metadata of a day table. A table without a newest
// key but with readings gets MaxTicks: every write reads first.
func readMeta(db *badger.DB) (tableMeta, error) {
	var m tableMeta
	err := versions.ViewLatest(db, func(txn *badger.Txn) error {
		readings, err := readUint64(txn, metaReadingsKey)
		if err != nil {
			return err
		}
		newest, err := readUint64(txn, metaNewestKey)
		if err != nil {
			return err
		}
		if m.format, err = readFormat(txn, readings > 0); err != nil {
			return err
		}
		m.readings = int64(max(readings, 0))
		switch {
		case newest >= 0:
			m.newest = buckets.Ticks(newest)
		case readings > 0:
			m.newest = buckets.MaxTicks
		default:
			m.newest = -1
		}
		return nil
	})
	if err != nil {
		return m, fmt.Errorf("read table metadata: %w", err)
	}
	return m, nil
}

// readFormat reads the format version of a table and refuses any but
// formatVersion. A table with readings but no version is version 1.
func readFormat(txn *badger.Txn, hasReadings bool) (byte, error) {
	item, err := txn.Get(metaFormatKey)
	if errors.Is(err, badger.ErrKeyNotFound) {
		if hasReadings {
			return 0, &formatError{version: "1 (one entry per reading)"}
		}
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return 0, err
	}
	if len(v) != 1 || v[0] != formatVersion {
		version := fmt.Sprintf("%x", v)
		if len(v) == 1 {
			version = fmt.Sprint(v[0])
		}
		return 0, &formatError{version: version}
	}
	return v[0], nil
}

// formatError is the cause of a table of an unknown format version.
type formatError struct{ version string }

func (e *formatError) Error() string {
	return fmt.Sprintf("table format version %s is unknown; this build reads version %d", e.version, formatVersion)
}

// readUint64 reads an 8-byte big-endian metadata value; -1 if absent.
func readUint64(txn *badger.Txn, key []byte) (int64, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return -1, nil
	}
	if err != nil {
		return 0, err
	}
	var n int64
	err = item.Value(func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("%q has %d bytes, want 8", key, len(v))
		}
		n = int64(binary.BigEndian.Uint64(v))
		return nil
	})
	return n, err
}
