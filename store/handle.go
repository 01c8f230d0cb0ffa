package store

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/badgeropts"
	"github.com/telemetryd/telemetryd/store/blocked"
	"github.com/telemetryd/telemetryd/store/repair"
	"github.com/telemetryd/telemetryd/store/settlequeue"
	"github.com/telemetryd/telemetryd/store/versions"
)

// tableOpenings numbers the openings of day table databases (table.gen),
// so that a block's version, which counts only within one opening,
// names its bytes together with it (store/colcache).
var tableOpenings atomic.Uint64

// A day table's database is opened lazily and closed again when it is
// idle, when a write needs a writable one in place of a read-only one,
// when the table is dropped, and at Close. Each opening is a handle,
// counted under Store.mu:
//
//   - the table refers to its current handle (table.cur), and that
//     counts as one reference; the goroutine that opens it holds one
//     until the open is over, and every acquire holds one;
//   - detaching a handle (closeIdle, a writable reopen, DropTable,
//     Close) takes the table's reference away, so that nothing new
//     reaches it;
//   - whoever gives up the last reference ends the handle: the database
//     is closed and the end announced, which a drop waits for before it
//     removes the table's directory. Giving up a reference (release,
//     unhold) hands that close to a goroutine of its own, so that a
//     reader never closes a database (settle.go); a detach ends the
//     handle on the detaching goroutine.
//
// A new handle of a table opens only after the one before it ended, so
// a table never has two open databases, and the only wait anyone does
// is for a handle's open (ready) or end (ended), with a context.

// handle is one opening of a day table's database.
type handle struct {
	t *table
	// prev is the handle before this one, which must end before this
	// one opens. Only the opener uses it.
	prev *handle
	// ready is closed when the open is over; err is set before.
	ready chan struct{}
	// err is why the handle did not open: the table is damaged, or the
	// handle was dropped before it opened (errDropping).
	err error
	// ended is closed when the handle ended: its database is closed.
	ended chan struct{}

	// Guarded by Store.mu.
	refs     int  // the table's while it is cur, the opener's, and one per acquire
	writable bool // it opens, or opened, the database writable
	detached bool // it is no longer cur: it ends with its last reference
	dropped  bool // detached by a drop: it does not open if it has not yet
	skipped  bool // it did not open because it was dropped
}

// acquire returns the open table of day with a reference held, opening
// it if needed. For reads it returns (nil, nil) when the table does not
// exist or is being dropped. The caller must release the table.
func (s *Store) acquire(ctx context.Context, day buckets.Day, a access) (*table, error) {
	h, idle, err := s.ref(day, a)
	if idle != nil {
		s.endLogged(idle)
	}
	if h == nil {
		return nil, err
	}
	select {
	case <-h.ready:
	default:
		select {
		case <-h.ready:
		case <-ctx.Done():
			s.unref(h)
			return nil, ctx.Err()
		}
	}
	if err := h.err; err != nil {
		s.unref(h)
		if a == forRead && errors.Is(err, errDropping) {
			return nil, nil
		}
		return nil, err
	}
	return h.t, nil
}

// ref takes a reference to the handle of day that a calls for, making
// one (and starting its open) when there is none. A writer replaces a
// read-only handle: it is detached, and idle is that handle when the
// writer's detach gave up its last reference (the caller ends it).
func (s *Store) ref(day buckets.Day, a access) (h, idle *handle, err error) {
	s.mu.Lock()
	t, err := s.route(day, a)
	if t == nil {
		s.mu.Unlock()
		return nil, nil, err
	}
	h = t.cur
	if h != nil && a == forWrite && !h.writable && !s.opts.ReadOnly {
		if s.detach(h) {
			idle = h
		}
		h = nil
	}
	if h == nil {
		if t.failErr != nil && s.now().Sub(t.failedAt) < reopenAfter {
			s.mu.Unlock()
			return nil, idle, unavailableTable(day, t.failErr)
		}
		h = s.newHandle(t, a)
	}
	h.refs++
	s.inflight.Add(1)
	s.touch(t)
	s.mu.Unlock()
	return h, idle, nil
}

// route returns the table of day that a may use, creating it for a
// write; nil for a read of a missing or dropping table. s.mu is held.
func (s *Store) route(day buckets.Day, a access) (*table, error) {
	if s.closed {
		return nil, errClosed
	}
	t := s.tables[day]
	if t == nil && a == forWrite {
		t = newTable(day, s.tableDir(day), s.bad)
		s.tables[day] = t
	}
	switch {
	case t == nil || (t.dropping && a == forRead):
		return nil, nil
	case t.dropping:
		return nil, tableDropping(day)
	}
	return t, nil
}

// tableDir is the directory of the table of day.
func (s *Store) tableDir(day buckets.Day) string {
	return TableDir(s.dir, day)
}

// TableDir is the directory of the table of day under the data
// directory dataDir.
func TableDir(dataDir string, day buckets.Day) string {
	return filepath.Join(dataDir, tablesDirName, day.String())
}

// tableDropping is the error of a write to a table being dropped.
func tableDropping(day buckets.Day) error {
	return &buckets.TableError{Day: day, Reason: "is being dropped", Err: errDropping}
}

// newHandle makes the current handle of t, which has none, and starts
// its open. s.mu is held.
func (s *Store) newHandle(t *table, a access) *handle {
	h := &handle{
		t:        t,
		prev:     t.last,
		ready:    make(chan struct{}),
		ended:    make(chan struct{}),
		refs:     2, // the table's and the opener's
		writable: !s.opts.ReadOnly && (a == forWrite || s.isHot(t.day)),
	}
	t.cur, t.last = h, h
	s.inflight.Add(1) // the opener's reference
	go s.open(h)
	return h
}

// open opens the database of h once the handle before it ended, gives
// up the opener's reference, and has the number of open cold tables
// kept bounded in the background.
func (s *Store) open(h *handle) {
	if h.prev != nil {
		<-h.prev.ended
		h.prev = nil
	}
	s.mu.Lock()
	h.skipped = h.dropped
	skip, hot, writable := h.skipped, s.isHot(h.t.day), h.writable
	s.mu.Unlock()
	if skip {
		h.err = tableDropping(h.t.day)
	} else {
		h.err = s.openHandle(h, hot, writable)
	}
	close(h.ready)
	if h.err == nil {
		s.inflight.Add(1) // while the opener's reference still counts
		go func() {
			defer s.inflight.Done()
			s.closeIdle()
		}()
	}
	s.unref(h)
}

// openHandle opens the database of h and installs it in the table. A
// failure detaches h and is remembered for reopenAfter.
func (s *Store) openHandle(h *handle, hot, writable bool) error {
	t := h.t
	db, readOnly, meta, err := s.openTableDB(t, hot, writable)
	t.writeMu.Lock() // free: writers wait for this open
	counted := t.countFile
	t.writeMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		t.failErr, t.failedAt = err, s.now()
		s.detach(h) // not the last reference: the opener holds one
		s.metrics.TableErrors.Add(context.Background(), 1)
		if writable {
			s.health.Mark(s.log, t.day, blocked.Damaged, err)
		} else {
			s.log.Error("day table cannot be opened (damaged?); its queries fail: "+blocked.RepairAdvice(t.day),
				"day", t.day.String(), "dir", t.dir, "err", err)
		}
		return unavailableTable(t.day, err)
	}
	t.db, t.hot, t.readOnly, t.live, t.failErr = db, hot, readOnly, h, nil
	if !readOnly && s.health.IsFor(t.day, blocked.Damaged) {
		s.health.Clear(s.log, t.day, "opened")
	}
	t.gen = tableOpenings.Add(1)
	h.writable = !readOnly
	if known := t.readings.Load(); known >= 0 && known != meta.readings {
		s.log.Warn("day table reading count file disagreed with the table; using the table's count",
			"day", t.day.String(), "file", known, "table_count", meta.readings)
	}
	t.readings.Store(meta.readings)
	t.newest = meta.newest
	t.formatSaved = meta.format != 0
	t.comp = compactState{scanAll: !readOnly, known: meta.readings == 0 && meta.newest < 0}
	// A table opened read-only with its count file has nothing to
	// settle; any other is settled by the compactor before it closes.
	t.settled.Store(s.opts.ReadOnly || (readOnly && counted))
	return nil
}

// detach takes the table's reference to h away, so that nothing new
// reaches h, and reports whether that was its last reference (the
// caller then ends h, without s.mu). s.mu is held.
func (s *Store) detach(h *handle) (last bool) {
	if h.detached {
		return false
	}
	h.detached = true
	if h.t.cur == h {
		h.t.cur = nil
	}
	h.refs--
	return h.refs == 0
}

// holdOpen takes a reference to the open writable database of t
// without opening anything or counting as a use, for the compactor and
// the count saver. s.mu is held.
func (s *Store) holdOpen(t *table) bool {
	return !t.readOnly && s.holdLive(t)
}

// holdLive is holdOpen for a database opened read-only too. s.mu is
// held.
func (s *Store) holdLive(t *table) bool {
	h := t.cur
	if s.closed || h == nil || h != t.live {
		return false
	}
	h.refs++
	s.inflight.Add(1)
	return true
}

// release gives up a reference taken by acquire, and counts as a use.
func (s *Store) release(t *table) { s.letGo(t, true) }

// unhold gives up a reference taken by holdOpen.
func (s *Store) unhold(t *table) { s.letGo(t, false) }

// letGo gives up a reference to the open handle of t, which the
// caller holds, and ends the handle if it was its last.
func (s *Store) letGo(t *table, use bool) {
	s.mu.Lock()
	h := t.live
	if use {
		s.touch(t)
	}
	h.refs--
	last := h.refs == 0
	s.mu.Unlock()
	s.released(h, last)
}

// released finishes giving up a reference to h outside s.mu: when that
// was its last reference, h ends on a goroutine of its own (still
// counted in s.inflight), so that the caller, a reader perhaps, never
// waits for a database to close.
func (s *Store) released(h *handle, last bool) {
	if !last {
		s.inflight.Done()
		return
	}
	go func() {
		defer s.inflight.Done()
		s.endLogged(h)
	}()
}

// unref gives up a reference to h that ref or newHandle took, and ends
// h if it was its last.
func (s *Store) unref(h *handle) {
	s.mu.Lock()
	h.refs--
	last := h.refs == 0
	s.mu.Unlock()
	s.released(h, last)
}

// end ends h, whose last reference is gone: it closes its database, if
// it opened one, and then announces the end. This is the one place a
// table is closed. It merges nothing and writes no count file: the
// compactor settled the table before an idle close (settle.go), and
// Close saves the counts itself.
func (s *Store) end(h *handle) error {
	t := h.t
	var err error
	if h.err == nil { // it opened: t.db is its database, and nobody else uses it
		if testHookTableWrite != nil && !t.readOnly {
			testHookTableWrite("close")
		}
		err = s.closeDB(t)
	}
	s.mu.Lock()
	if h.err == nil {
		t.db, t.live = nil, nil
	}
	if t.last == h {
		t.last = nil
	}
	s.mu.Unlock()
	close(h.ended)
	return err
}

// endLogged ends h and logs a failure to close its database.
func (s *Store) endLogged(h *handle) {
	if err := s.end(h); err != nil {
		s.log.Error("close day table", "day", h.t.day.String(), "err", err)
	}
}

// closeDB closes the database of t, which nobody holds any more.
func (s *Store) closeDB(t *table) error {
	db := t.db
	if err := db.Close(); err != nil {
		return err
	}
	badgeropts.ReleaseView(db)
	return nil
}

// guard runs a read of t, turning a Badger panic (it panics on some
// kinds of damaged data) into an error wrapping buckets.ErrUnavailable
// that names the day, logged once here.
func (s *Store) guard(t *table, read func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.metrics.TableErrors.Add(context.Background(), 1)
			s.log.Error("reading a day table failed; it may be damaged", "day", t.day.String(), "panic", blocked.FirstLine(fmt.Sprint(r)))
			err = &buckets.TableError{Day: t.day, Reason: "read failed (damaged?); other days are unaffected",
				Err: errors.New(blocked.FirstLine(fmt.Sprint(r)))}
		}
	}()
	return read()
}

// staysOpen reports whether t has an open database that nothing has
// asked to close. s.mu is held.
func (t *table) staysOpen() bool {
	return t.live != nil && !t.live.detached
}

// touch records a use of t. s.mu is held.
func (s *Store) touch(t *table) {
	s.useSeq++
	t.lastUsed, t.useSeq = s.now(), s.useSeq
}

// now is the injected clock.
func (s *Store) now() time.Time { return s.opts.Now() }

// today is the UTC day of the injected clock.
func (s *Store) today() buckets.Day { return buckets.DayOfTime(s.now()) }

// isHot reports whether day is one of the HotDays newest days (days
// after today, which the future skew allows, are hot too).
func (s *Store) isHot(day buckets.Day) bool {
	return day > s.today()-buckets.Day(s.opts.HotDays)
}

// closeIdle closes open cold tables (days that are not hot) that nobody
// holds and that were idle for IdleClose, and, least recently used
// first, as many more as it takes to leave at most MaxOpenTables cold
// tables open. A table opened hot whose day turned cold is closed as
// soon as it is idle, to give back its write-sized buffers; it reopens
// as a cold table on its next use. Tables in use are never closed; they
// count against the bound until released. A table it would close that
// is not settled is handed to the compactor instead (settle.go), which
// sweeps again once it settled it; it returns those hand-overs.
func (s *Store) closeIdle() []*settlequeue.Job {
	now := s.now()
	s.mu.Lock()
	var cold []*table
	for _, t := range s.tables {
		if t.staysOpen() && !s.isHot(t.day) {
			cold = append(cold, t)
		}
	}
	slices.SortFunc(cold, func(a, b *table) int { return cmp.Compare(a.useSeq, b.useSeq) })
	excess := len(cold) - s.opts.MaxOpenTables
	var idle []*handle
	var unsettled []buckets.Day
	for _, t := range cold {
		h := t.live
		if h.refs > 1 {
			continue // in use
		}
		if excess <= 0 && !t.hot && now.Sub(t.lastUsed) < s.opts.IdleClose {
			continue
		}
		excess--
		if !t.settled.Load() { // stable: nobody else holds the table
			unsettled = append(unsettled, t.day)
			continue
		}
		if s.detach(h) {
			idle = append(idle, h)
		}
	}
	s.mu.Unlock()
	var jobs []*settlequeue.Job
	for _, d := range unsettled {
		if j := s.settles.Add(d); j != nil {
			jobs = append(jobs, j)
		}
	}
	for _, h := range idle {
		s.endLogged(h)
	}
	return jobs
}

func newTable(day buckets.Day, dir string, bad *badBlocks) *table {
	t := &table{day: day, dir: dir, bad: bad}
	t.readings.Store(-1)
	return t
}

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
	var fe *formatError
	if errors.As(err, &fe) && fe.unversioned {
		// Readings and no version: a table of format version 1, or
		// a damaged block that hid the version key (Badger reads
		// without checking checksums).
		if verr := verifyChecksums(db); verr != nil {
			err = fmt.Errorf("no version key, and its files fail their checks: %w", verr)
		}
	}
	if err != nil {
		return m, fmt.Errorf("read table metadata: %w", err)
	}
	return m, nil
}

// verifyChecksums checks every block of db's table files against its
// checksum, turning a Badger panic into an error.
func verifyChecksums(db *badger.DB) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("damaged: %s", blocked.FirstLine(fmt.Sprint(r)))
		}
	}()
	return db.VerifyChecksum()
}

// readFormat reads the format version of a table and refuses any but
// formatVersion. A table with readings but no version is version 1
// (unless it is damaged: readMeta).
func readFormat(txn *badger.Txn, hasReadings bool) (byte, error) {
	item, err := txn.Get(metaFormatKey)
	if errors.Is(err, badger.ErrKeyNotFound) {
		if hasReadings {
			return 0, &formatError{version: "1 (one entry per reading)", unversioned: true}
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
type formatError struct {
	version     string
	unversioned bool // no version recorded, with readings: version 1
}

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
