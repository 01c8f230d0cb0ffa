package store

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
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
// may be closed and reopened while the store runs.
//
// Every read and write holds a reference (Store.acquire, Store.release)
// for as long as it uses db; a table is closed or dropped only when no
// reference is held.
//
// A cold table (a day that is not hot) opened for a read is opened
// read-only: Badger then runs no compactions and writes nothing, so
// closing it, as a drop does, never waits for a compaction. A write to
// it reopens it writable once the readers holding it are done.
type table struct {
	day buckets.Day
	dir string

	// readings is the exact number of readings, or -1 when it is not
	// known: the table was not opened in this process and has no count
	// file (see countfile.go). Writers update it under writeMu.
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
	// ver numbers commits and tracks readers' versions (versions.go).
	ver versions
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

	// Guarded by Store.mu.
	db       *badger.DB
	hot      bool          // db was opened with hot options
	readOnly bool          // db was opened read-only
	refs     int           // references held
	lastUsed time.Time     // when the last reference was taken or released
	useSeq   uint64        // Store.useSeq at that moment: orders tables for LRU
	busy     chan struct{} // non-nil while db is being opened, closed or reopened
	dropping bool          // DropTable is under way: route nothing new here
	released chan struct{} // closed (and cleared) when a reference is given up
	failErr  error         // why the last open failed
	failedAt time.Time     // when it failed
}

func newTable(day buckets.Day, dir string) *table {
	t := &table{day: day, dir: dir}
	t.readings.Store(-1)
	return t
}

// access says what a caller wants a table for.
type access uint8

const (
	forRead  access = iota // a missing or dropping table reads as empty
	forWrite               // a missing table is created; a dropping one is unavailable
)

// acquire returns the open table of day with a reference held, opening
// it if needed. For reads it returns (nil, nil) when the table does not
// exist or is being dropped. The caller must release the table.
func (s *Store) acquire(ctx context.Context, day buckets.Day, a access) (*table, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	t := s.tables[day]
	if t == nil {
		if a == forRead {
			s.mu.Unlock()
			return nil, nil
		}
		t = newTable(day, s.tableDir(day))
		s.tables[day] = t
	}
	t.refs++
	s.inflight.Add(1)
	for {
		if t.dropping {
			s.releaseLocked(t)
			s.mu.Unlock()
			if a == forRead {
				return nil, nil
			}
			return nil, &buckets.TableError{Day: day, Reason: "is being dropped", Err: errDropping}
		}
		if t.busy != nil {
			if err := s.waitBusyLocked(ctx, t); err != nil {
				s.releaseLocked(t)
				s.mu.Unlock()
				return nil, err
			}
			continue
		}
		if t.db != nil {
			if a == forWrite && t.readOnly && !s.opts.ReadOnly {
				if err := s.reopenWritableLocked(ctx, t); err != nil {
					s.releaseLocked(t)
					s.mu.Unlock()
					return nil, err
				}
				continue
			}
			s.touchLocked(t)
			s.mu.Unlock()
			return t, nil
		}
		if t.failErr != nil && s.now().Sub(t.failedAt) < reopenAfter {
			err := t.failErr
			s.releaseLocked(t)
			s.mu.Unlock()
			return nil, unavailableTable(day, err)
		}
		if err := s.openLocked(t, a); err != nil {
			s.releaseLocked(t)
			s.mu.Unlock()
			return nil, err
		}
	}
}

// waitBusyLocked waits, with s.mu held (released while waiting), for
// the open, close or reopen of t under way to finish. The caller's
// reference does not count while it waits: a reopen waits for the
// other holders to leave.
func (s *Store) waitBusyLocked(ctx context.Context, t *table) error {
	ch := t.busy
	s.unrefLocked(t)
	s.mu.Unlock()
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.mu.Lock()
	t.refs++
	return err
}

// waitReleaseLocked waits, with s.mu held (released while waiting),
// until a reference to t is given up.
func (s *Store) waitReleaseLocked(ctx context.Context, t *table) error {
	if t.released == nil {
		t.released = make(chan struct{})
	}
	ch := t.released
	s.mu.Unlock()
	defer s.mu.Lock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// openLocked opens the database of t for a. It is called with s.mu held
// and returns with it held, releasing it while Badger opens.
func (s *Store) openLocked(t *table, a access) error {
	ch := make(chan struct{})
	t.busy = ch
	err := s.openBusyLocked(t, a)
	t.busy = nil
	close(ch)
	if err != nil {
		return err
	}
	// Keep the number of open cold tables bounded, and close tables
	// that a new day made cold. This closes other tables only (t is
	// referenced), in the background.
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		s.closeIdle()
	}()
	return nil
}

// openBusyLocked opens the database of t for a while t.busy is set. It
// is called with s.mu held and returns with it held, releasing it while
// Badger opens.
func (s *Store) openBusyLocked(t *table, a access) error {
	hot := s.isHot(t.day)
	s.mu.Unlock()
	db, readOnly, meta, err := s.openTableDB(t, hot, a)
	s.mu.Lock()
	if err != nil {
		t.failErr, t.failedAt = err, s.now()
		s.metrics.tableErrors.Add(context.Background(), 1)
		s.log.Error("day table cannot be opened; its queries fail until it is repaired or dropped",
			"table", t.day.String(), "dir", t.dir, "err", err)
		return unavailableTable(t.day, err)
	}
	t.db, t.hot, t.readOnly, t.failErr = db, hot, readOnly, nil
	if known := t.readings.Load(); known >= 0 && known != meta.readings {
		s.log.Warn("day table reading count file disagreed with the table; using the table's count",
			"table", t.day.String(), "file", known, "table_count", meta.readings)
	}
	t.readings.Store(meta.readings)
	t.newest = meta.newest
	t.formatSaved = meta.format != 0
	t.comp = compactState{scanAll: !readOnly}
	return nil
}

// reopenWritableLocked replaces the read-only database of t with a
// writable one, for a writer holding a reference. New callers wait
// (t.busy) while the other holders finish with the read-only one. It
// is called with s.mu held and returns with it held. If a drop starts
// meanwhile it gives up and leaves t.db unchanged or nil.
func (s *Store) reopenWritableLocked(ctx context.Context, t *table) error {
	ch := make(chan struct{})
	t.busy = ch
	defer func() {
		t.busy = nil
		close(ch)
	}()
	for t.refs > 1 && !t.dropping {
		if err := s.waitReleaseLocked(ctx, t); err != nil {
			return err
		}
	}
	if t.dropping {
		return nil // the caller sees it
	}
	db := t.db
	t.db = nil
	s.mu.Unlock()
	err := db.Close()
	s.mu.Lock()
	if err != nil {
		s.log.Error("close read-only table", "table", t.day.String(), "err", err)
	}
	return s.openBusyLocked(t, forWrite)
}

// unavailableTable is the error of a table that cannot be opened.
func unavailableTable(day buckets.Day, err error) error {
	var fe *formatError
	if errors.As(err, &fe) {
		return &buckets.TableError{Day: day, Reason: fmt.Sprintf("has table format version %s, which this build does not read (it reads version %d); other days are unaffected", fe.version, formatVersion), Err: err}
	}
	return &buckets.TableError{Day: day, Reason: "cannot be opened (damaged?); other days are unaffected", Err: err}
}

// openTableDB opens the Badger database of t and reads its metadata. A
// cold table opened for a read is opened read-only, unless it was not
// closed cleanly (Badger must then replay and truncate its write-ahead
// log, which needs write access). Badger panics on some kinds of
// damage; that is turned into an error so one damaged day cannot take
// the process down.
func (s *Store) openTableDB(t *table, hot bool, a access) (db *badger.DB, readOnly bool, meta tableMeta, err error) {
	class := classCold
	if hot {
		class = classHot
	}
	readOnly = s.opts.ReadOnly || (!hot && a == forRead && closedCleanly(t.dir))
	opts := badgerOptions(t.dir, class, s.opts.SyncWrites, readOnly, s.log.With("table", t.day.String())).
		WithIndexCacheSize(s.opts.IndexCacheSize)
	if hot {
		opts = opts.WithMemTableSize(s.opts.MemTableSize).WithBlockCacheSize(s.opts.BlockCacheSize).
			WithValueThreshold(min(valueThreshold, s.opts.MemTableSize/8))
	}
	if err := checkTableFiles(t.dir, opts); err != nil {
		return nil, false, meta, err
	}
	db, err = openView(opts, openTableBadger)
	if err != nil && readOnly && !s.opts.ReadOnly {
		// Such as a directory whose creation a crash interrupted: a
		// writable open completes what it can.
		s.log.Debug("opening day table read-only failed; opening it writable", "table", t.day.String(), "err", err)
		readOnly = false
		db, err = openTableBadger(opts.WithReadOnly(false))
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

// closedCleanly reports whether the Badger database in dir was closed
// cleanly: it has no write-ahead log (*.mem) files, which Badger
// removes on Close after flushing them.
func closedCleanly(dir string) bool {
	mems, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	return err == nil && len(mems) == 0
}

// openBadger is badger.Open with panics turned into errors.
func openBadger(opts badger.Options) (db *badger.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("badger panicked: %v", r)
		}
	}()
	return badger.Open(opts)
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
	err := viewLatest(db, func(txn *badger.Txn) error {
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

// release drops a reference taken by acquire.
func (s *Store) release(t *table) {
	s.mu.Lock()
	s.releaseLocked(t)
	s.mu.Unlock()
}

func (s *Store) releaseLocked(t *table) {
	s.unrefLocked(t)
	s.touchLocked(t)
	s.inflight.Done()
}

// unrefLocked gives up a reference to t and wakes whoever waits for
// one to be given up.
func (s *Store) unrefLocked(t *table) {
	t.refs--
	if t.released != nil {
		close(t.released)
		t.released = nil
	}
}

// touchLocked records a use of t.
func (s *Store) touchLocked(t *table) {
	s.useSeq++
	t.lastUsed, t.useSeq = s.now(), s.useSeq
}

// closeIdle closes open cold tables (days that are not hot) that nobody
// holds and that were idle for IdleClose, and, least recently used
// first, as many more as it takes to leave at most MaxOpenTables cold
// tables open. A table opened hot whose day turned cold is closed as
// soon as it is idle, to give back its write-sized buffers; it reopens
// as a cold table on its next use. Tables in use are never closed; they
// count against the bound until released.
func (s *Store) closeIdle() {
	now := s.now()
	s.mu.Lock()
	var cold []*table
	for _, t := range s.tables {
		if t.db != nil && !s.isHot(t.day) {
			cold = append(cold, t)
		}
	}
	slices.SortFunc(cold, func(a, b *table) int { return cmp.Compare(a.useSeq, b.useSeq) })
	excess := len(cold) - s.opts.MaxOpenTables
	var victims []*table
	var dbs []*badger.DB
	for _, t := range cold {
		if t.refs > 0 || t.busy != nil || t.dropping {
			continue
		}
		if excess <= 0 && !t.hot && now.Sub(t.lastUsed) < s.opts.IdleClose {
			continue
		}
		excess--
		victims, dbs = append(victims, t), append(dbs, t.db)
		t.db, t.busy = nil, make(chan struct{})
		s.inflight.Add(1)
	}
	s.mu.Unlock()
	for i, t := range victims {
		s.compactBeforeClose(t, dbs[i])
		err := s.closeDB(t, dbs[i])
		s.mu.Lock()
		close(t.busy)
		t.busy = nil
		s.mu.Unlock()
		s.inflight.Done()
		if err != nil {
			s.log.Error("close idle table", "table", t.day.String(), "err", err)
		}
	}
}

// compactBeforeClose merges the open blocks of t, whose database db
// closeIdle is about to close, unless it is read-only. t.busy keeps
// everyone else out meanwhile.
func (s *Store) compactBeforeClose(t *table, db *badger.DB) {
	if t.readOnly || s.opts.ReadOnly {
		return
	}
	s.mu.Lock()
	t.db = db
	s.mu.Unlock()
	if err := s.compactTable(t, true); err != nil {
		s.log.Error("compact table before closing it", "table", t.day.String(), "err", err)
	}
	s.mu.Lock()
	t.db = nil
	s.mu.Unlock()
}

// closeDB closes db, the database of t, which nobody holds any more,
// and then saves the count file of t if it is missing. A table whose
// close failed keeps no count file.
func (s *Store) closeDB(t *table, db *badger.DB) error {
	if err := db.Close(); err != nil {
		return err
	}
	releaseView(db)
	t.writeMu.Lock()
	s.saveCount(t)
	t.writeMu.Unlock()
	return nil
}
