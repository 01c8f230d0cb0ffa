package store

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/dgraph-io/badger/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
	"github.com/telemetryd/telemetryd/store/compactplan"
	"github.com/telemetryd/telemetryd/store/resolve"
	"github.com/telemetryd/telemetryd/store/spans"
)

// Write stores rs. Readings are grouped by day table and each table
// gets one Badger transaction holding all of its readings, so a
// message is committed atomically per day table (like an Azure entity
// group transaction). A reading whose (device, ticks) already exists
// is merged into the stored one with buckets.Merge (the new value wins
// per name); readings with the same key inside rs merge in slice
// order. Writing the same readings again leaves the stored bytes
// unchanged, so redelivery is idempotent.
//
// A table's readings that do not fit one Badger transaction
// (badger.ErrTxnTooBig) are committed in several consecutive
// transactions. A failure between them leaves a prefix committed;
// because writes are idempotent merges, redelivering the message
// converges to the same result.
//
// After the tables commit, the device index is updated. Transient
// conditions (a table being dropped, a closing store, blocked writes,
// a full disk) return errors wrapping buckets.ErrUnavailable; the rs
// must be valid readings (buckets.Reading.Validate), else nothing is
// written and the error wraps buckets.ErrInvalidReading.
func (s *Store) Write(ctx context.Context, rs []buckets.Reading) (err error) {
	if len(rs) == 0 {
		return nil
	}
	if s.opts.ReadOnly {
		return errReadOnly
	}
	var prev *buckets.Reading
	for i := range rs {
		if err := rs[i].ValidateAfter(prev); err != nil {
			return fmt.Errorf("write: reading %d: %w", i, err)
		}
		prev = &rs[i]
	}
	if s.diskTight(false) {
		return fmt.Errorf("write: %w: %w", buckets.ErrUnavailable, errDiskTight)
	}
	s.fault(BeforeCommit)
	groups := groupByDay(rs)
	ctx, span := s.tracer.Start(ctx, "store.commit", trace.WithAttributes(
		attribute.Int("telemetry.store.readings", len(rs)),
		attribute.Int("telemetry.store.tables", len(groups))))
	start := time.Now()
	defer func() {
		s.metrics.CommitDuration.Record(ctx, time.Since(start).Seconds())
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()

	var urgent []buckets.DeviceID
	for _, g := range groups {
		if err := s.writeDay(ctx, g.day, g.readings); err != nil {
			// Keep what earlier tables committed visible in the index.
			if perr := s.index.Persist(urgent); perr != nil {
				s.log.Error("persist device index", "err", perr)
			}
			return err
		}
		urgent = append(urgent, s.index.Observe(g.readings)...)
	}
	if err := s.index.Persist(urgent); err != nil {
		return classify(fmt.Errorf("write: %w", err))
	}
	s.fault(AfterCommit)
	return nil
}

// dayGroup is the readings of rs that fall in one day, in slice order.
type dayGroup struct {
	day      buckets.Day
	readings []buckets.Reading
}

// groupByDay splits rs by day, ascending by day.
func groupByDay(rs []buckets.Reading) []dayGroup {
	first := rs[0].Day()
	same := true
	for i := range rs {
		if rs[i].Day() != first {
			same = false
			break
		}
	}
	if same {
		return []dayGroup{{day: first, readings: rs}}
	}
	byDay := make(map[buckets.Day][]buckets.Reading)
	for _, r := range rs {
		byDay[r.Day()] = append(byDay[r.Day()], r)
	}
	groups := make([]dayGroup, 0, len(byDay))
	for d, g := range byDay {
		groups = append(groups, dayGroup{day: d, readings: g})
	}
	slices.SortFunc(groups, func(a, b dayGroup) int { return int(a.day - b.day) })
	return groups
}

// writeDay commits the readings of one day to its table.
func (s *Store) writeDay(ctx context.Context, day buckets.Day, rs []buckets.Reading) error {
	t, err := s.acquire(ctx, day, forWrite)
	if err != nil {
		return fmt.Errorf("write table %s: %w", day, err)
	}
	defer s.release(t)
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	entries, err := planWrites(t, rs)
	if err != nil {
		return classify(fmt.Errorf("write table %s: %w", day, err))
	}
	if len(entries) == 0 {
		return nil // a redelivery: nothing changes
	}
	err = s.beforeCommit(t)
	if err == nil {
		err = commitEntries(t, entries)
	}
	s.health.NoteCommit(s.log, day, err)
	if err != nil {
		s.watch.Removed("") // a part may have committed
		return classify(fmt.Errorf("write table %s: %w", day, err))
	}
	s.watch.Committed(rs)
	return nil
}

// entry is one block to write to a day table.
type entry struct {
	dev    buckets.DeviceID
	ref    blockRef // its sequence is set when it is committed
	value  []byte
	meta   byte          // Badger user meta of the entry (series.go)
	added  int64         // readings new to the table
	newest buckets.Ticks // newest new reading, -1 for none
	// first and last are the values of the block's oldest and newest
	// readings, for a block a write made (nil for a compaction's).
	first, last []buckets.Field
	// overlaps says that an open block a write made may overlap a
	// block already stored (writeTracker.mayOverlap before the commit).
	overlaps bool
}

// readingKey is the identity of a reading.
type readingKey struct {
	device buckets.DeviceID
	ticks  buckets.Ticks
}

// maxWrittenDevices bounds writeTracker.written; past it a table falls
// back to reading before writing anything not newer than its newest
// reading. A variable so that tests can reach the bound.
var maxWrittenDevices = 100_000

// writeTracker remembers what this process wrote to one open table, so
// that most writes need no read first (see mayExist). It describes one
// opening of the table's database and is reset when it is opened again.
// Guarded by the table's writeMu.
type writeTracker struct {
	db *badger.DB // the opening it describes
	// floor: a key the table held when it was opened is not newer than
	// floor (its newest reading then).
	floor buckets.Ticks
	// written covers, per device, every reading written since, and
	// keeps the newest of them.
	written map[buckets.DeviceID]deviceWrites
	// lastBytes is the size of the values kept (deviceWrites.last), at
	// most maxLastBytes.
	lastBytes int
}

// deviceWrites is what a write tracker knows of one device.
type deviceWrites struct {
	spans.Set // every reading written since the table was opened
	// last, when not nil, is what the table holds at lastTicks, the
	// newest reading this process wrote for the device: a write that
	// merges into that reading alone (the second half of a reading
	// whose first half the previous commit wrote) takes it from here
	// instead of reading and decoding the device's newest block.
	last      []buckets.Field
	lastTicks buckets.Ticks
	// first, when not nil, is what the table holds at firstTicks, the
	// oldest reading of the device's latest write: when two messages
	// arrive in the other order (the second half of a reading first),
	// the older one merges into it from here.
	first      []buckets.Field
	firstTicks buckets.Ticks
}

// keep replaces what *vs holds with a copy of new (nil: nothing) when
// the tracker's bound leaves room for it.
func (w *writeTracker) keep(vs *[]buckets.Field, new []buckets.Field) {
	w.lastBytes -= valuesBytes(*vs)
	*vs = nil
	if n := valuesBytes(new); new != nil && w.lastBytes+n <= maxLastBytes {
		*vs = slices.Clone(new)
		w.lastBytes += n
	}
}

// maxLastBytes bounds the values write trackers keep per table
// (deviceWrites.last and first). A device's deletion drops its entry without
// giving its bytes back: the bound then errs towards keeping less. A
// variable so that tests can reach the bound.
var maxLastBytes = 4 << 20

// fieldBytes is what a kept value costs, besides its string bytes.
const fieldBytes = int(unsafe.Sizeof(buckets.Field{}))

// valuesBytes is what keeping vs costs.
func valuesBytes(vs []buckets.Field) int {
	n := len(vs) * fieldBytes
	for _, f := range vs {
		if f.Value.Kind == buckets.KindString {
			n += len(f.Value.AsString())
		}
	}
	return n
}

// tracker returns the write tracker of t's current database, resetting
// it when the database was (re)opened since it was last used. It must
// run under writeMu with a reference to t held.
func (t *table) tracker() *writeTracker {
	if t.wt.db != t.db {
		t.wt = writeTracker{db: t.db, floor: t.newest, written: make(map[buckets.DeviceID]deviceWrites)}
	}
	return &t.wt
}

// mayExist reports whether a reading of dev at k may already be stored,
// so that writing it must read the stored one first to merge: only if
// it is not newer than floor, or within what was written for its
// device since. Devices send readings in time order, so this spares
// the read for almost every reading, also when many devices report the
// same instants, and also when the messages of two requests in flight
// arrive in the other order (the later times first).
func (w *writeTracker) mayExist(dev buckets.DeviceID, k buckets.Ticks) bool {
	if k <= w.floor {
		return true
	}
	sp, ok := w.written[dev]
	return ok && sp.Overlaps(k, k)
}

// mayOverlap reports whether a block of dev holding readings from
// oldest to newest may overlap a block already stored.
func (w *writeTracker) mayOverlap(dev buckets.DeviceID, oldest, newest buckets.Ticks) bool {
	if oldest <= w.floor {
		return true
	}
	sp, ok := w.written[dev]
	return ok && sp.Overlaps(oldest, newest)
}

// markOverlaps sets entry.overlaps of the open blocks of a write that
// may overlap a block already stored, before the tracker notes them.
func (w *writeTracker) markOverlaps(entries []entry) {
	for i := range entries {
		e := &entries[i]
		e.overlaps = !e.ref.sealed && w.mayOverlap(e.dev, e.ref.oldest, e.ref.newest)
	}
}

// stored returns what the table holds of dev at k when the tracker
// keeps it: k is the newest reading this process wrote for dev, or
// the oldest of its latest write.
func (w *writeTracker) stored(dev buckets.DeviceID, k buckets.Ticks) ([]buckets.Field, bool) {
	dw, ok := w.written[dev]
	switch {
	case !ok:
		return nil, false
	case dw.last != nil && dw.lastTicks == k:
		return dw.last, true
	case dw.first != nil && dw.firstTicks == k:
		return dw.first, true
	}
	return nil, false
}

// noteWritten records committed blocks. newest is the table's newest
// reading after the commit. A block of a write (entry.last set) whose
// newest reading is not older than the one kept for its device
// replaces it, and its oldest reading replaces the oldest kept (a
// block of a write that held the kept oldest reading's ticks is a
// later write: no kept reading outlives a write of its ticks); the
// blocks of a compaction change no reading.
func (w *writeTracker) noteWritten(entries []entry, newest buckets.Ticks) {
	for _, e := range entries {
		dw, ok := w.written[e.dev]
		dw.Add(e.ref.oldest, e.ref.newest)
		if e.last != nil && (dw.last == nil || e.ref.newest >= dw.lastTicks) {
			w.keep(&dw.last, e.last)
			dw.lastTicks = e.ref.newest
		}
		if e.first != nil {
			w.keep(&dw.first, e.first)
			dw.firstTicks = e.ref.oldest
		}
		if ok {
			w.written[e.dev] = dw
		} else {
			w.written[buckets.DeviceID(strings.Clone(string(e.dev)))] = dw
		}
	}
	if len(w.written) > maxWrittenDevices {
		w.floor = newest
		clear(w.written)
		w.lastBytes = 0
	}
}

// forgetLast drops the readings kept for dev, after a commit of it
// failed: what the table holds is not known for sure. Its times stay.
func (w *writeTracker) forgetLast(dev buckets.DeviceID) {
	if dw, ok := w.written[dev]; ok {
		w.keep(&dw.last, nil)
		w.keep(&dw.first, nil)
		w.written[dev] = dw
	}
}

// testHookReadBeforeWrite, when set (by tests), runs when a write reads
// a device's stored readings to merge into them.
var testHookReadBeforeWrite func()

// maxBlockReadings is the most readings the store puts in one block.
const maxBlockReadings = 4096

// planWrites merges rs with each other (in slice order) and with what
// the table holds, and returns one block per device (more when a device
// has more than a block holds) with the readings that change the table.
// Unchanged readings (a redelivery) are left out. A reading that may
// already be stored (writeTracker.mayExist) is read first and written
// whole, merged, so the newest block holding a (device, ticks) holds
// its answer. It must run under the table's writeMu.
func planWrites(t *table, rs []buckets.Reading) ([]entry, error) {
	merged := mergeDuplicates(rs)
	slices.SortStableFunc(merged, func(a, b buckets.Reading) int {
		if c := strings.Compare(string(a.Device), string(b.Device)); c != 0 {
			return c
		}
		return cmp.Compare(a.Ticks, b.Ticks)
	})
	w := t.tracker()
	var txn *badger.Txn
	done := func() {}
	defer func() { done() }()
	var entries []entry
	for len(merged) > 0 {
		n := 1
		for n < len(merged) && merged[n].Device == merged[0].Device {
			n++
		}
		g := merged[:n]
		merged = merged[n:]
		lo, hi := buckets.MaxTicks, buckets.Ticks(-1)
		for _, r := range g {
			if w.mayExist(r.Device, r.Ticks) {
				lo, hi = min(lo, r.Ticks), max(hi, r.Ticks)
			}
		}
		var stored map[buckets.Ticks][]buckets.Field
		if vs, ok := w.stored(g[0].Device, lo); ok && lo == hi {
			stored = map[buckets.Ticks][]buckets.Field{lo: vs}
		} else if hi >= 0 {
			if testHookReadBeforeWrite != nil {
				testHookReadBeforeWrite()
			}
			if txn == nil {
				txn, done = t.ver.ReadTxn(t.db)
			}
			var err error
			if stored, err = storedReadings(t, txn, g[0].Device, lo, hi+1); err != nil {
				return nil, fmt.Errorf("read %s: %w", g[0].Device, err)
			}
		}
		es, err := deviceEntries(g, stored)
		if err != nil {
			return nil, err
		}
		entries = append(entries, es...)
	}
	return entries, nil
}

// storedReadings returns the stored readings of dev with lo <= ticks <
// hi, by ticks, from txn, a transaction of t. A corrupt block is
// skipped: what it held is lost either way, and the write goes on.
func storedReadings(t *table, txn *badger.Txn, dev buckets.DeviceID, lo, hi buckets.Ticks) (map[buckets.Ticks][]buckets.Field, error) {
	res := resolve.New()
	err := eachBlock(txn, dev, lo, func(bi blockItem) (bool, error) {
		if bi.ref.oldest >= hi {
			return true, nil
		}
		rs, err := decodeItem(bi, dev)
		if t.bad.skip(context.Background(), t.day, dev, err) {
			return true, nil
		}
		res.Add(rs, bi.ref.seq, lo, hi)
		return true, err
	})
	out := make(map[buckets.Ticks][]buckets.Field, len(res.Readings()))
	for _, r := range res.Readings() {
		out[r.Ticks] = r.Values
	}
	return out, err
}

// deviceEntries merges the readings g of one device, sorted by ticks,
// into the stored ones and encodes those that change into blocks.
func deviceEntries(g []buckets.Reading, stored map[buckets.Ticks][]buckets.Field) ([]entry, error) {
	out := make([]buckets.Reading, 0, len(g))
	isNew := make([]bool, 0, len(g))
	for _, r := range g {
		old, ok := stored[r.Ticks]
		if ok {
			m := buckets.Merge(old, r.Values)
			if slices.Equal(m, old) {
				continue // a redelivery: nothing changes
			}
			r.Values = m
		}
		out = append(out, r)
		isNew = append(isNew, !ok)
	}
	var entries []entry
	for len(out) > 0 {
		n := blockCut(out)
		e := entry{dev: out[0].Device, newest: -1,
			ref: blockRef{oldest: out[0].Ticks, newest: out[n-1].Ticks, count: n}}
		for i := range n {
			if isNew[i] {
				e.added++
				e.newest = out[i].Ticks
			}
		}
		var err error
		if e.value, err = encodeOpen(out[:n]); err != nil {
			return nil, err
		}
		e.meta = blockMeta(out[:n])
		e.first, e.last = out[0].Values, out[n-1].Values
		entries = append(entries, e)
		out, isNew = out[n:], isNew[n:]
	}
	return entries, nil
}

// encodeOpen encodes the open block of a commit. A block of the lowest
// size tier (fewer than sixteen readings, such as a truck's share of
// a line protocol request) is merged by the compactor once its device
// has compactTierBlocks of them, at the end of its hour, or when the
// table goes quiet, and the compactor compresses what it writes; so its
// columns are left uncompressed and zstd runs once on those readings
// (6-14% more line protocol ingest on the TSBS file, BENCHMARKS.md).
// Larger ones may stay open for an hour and are compressed at once.
func encodeOpen(rs []buckets.Reading) ([]byte, error) {
	if compactplan.TierOf(len(rs)) == 0 {
		return block.EncodePlain(nil, rs)
	}
	return block.Encode(nil, rs)
}

// blockCut returns how many of rs (at least one) go in one block: at
// most maxBlockReadings readings and block.MaxFields values.
func blockCut(rs []buckets.Reading) int {
	fields := 0
	for i, r := range rs {
		fields += len(r.Values)
		if i == maxBlockReadings || (i > 0 && fields > block.MaxFields) {
			return i
		}
	}
	return len(rs)
}

// mergeDuplicates merges readings with the same key in slice order,
// keeping the order of first appearance.
func mergeDuplicates(rs []buckets.Reading) []buckets.Reading {
	merged := make([]buckets.Reading, 0, len(rs))
	var pos map[readingKey]int
	for _, r := range rs {
		if pos == nil && (len(merged) == 0 || !mayRepeat(merged, r)) {
			merged = append(merged, r)
			continue
		}
		if pos == nil {
			pos = make(map[readingKey]int, len(rs))
			for i, m := range merged {
				pos[readingKey{m.Device, m.Ticks}] = i
			}
		}
		k := readingKey{r.Device, r.Ticks}
		if i, ok := pos[k]; ok {
			merged[i].Values = buckets.Merge(merged[i].Values, r.Values)
			continue
		}
		pos[k] = len(merged)
		merged = append(merged, r)
	}
	return merged
}

// mayRepeat is a cheap test for the common case of a batch without
// repeated keys: readings arrive sorted by device and time, so r can
// only repeat an earlier key if it is not strictly after the last one.
func mayRepeat(merged []buckets.Reading, r buckets.Reading) bool {
	last := merged[len(merged)-1]
	if c := strings.Compare(string(last.Device), string(r.Device)); c != 0 {
		return c > 0
	}
	return last.Ticks >= r.Ticks
}

// commitEntries writes entries in as few transactions as Badger allows,
// updating the table metadata in each. It must run under writeMu.
func commitEntries(t *table, entries []entry) error {
	maxSize := t.db.MaxBatchSize() * 9 / 10
	maxCount := t.db.MaxBatchCount() - 4
	for start := 0; start < len(entries); {
		end, size := start, int64(len(metaReadingsKey)+len(metaNewestKey)+len(metaFormatKey)+3*(8+2))
		threshold := t.db.Opts().ValueThreshold
		for end < len(entries) && (end == start || (size+entrySize(entries[end], threshold) <= maxSize && int64(end-start) < maxCount)) {
			size += entrySize(entries[end], threshold)
			end++
		}
		err := commitChunk(t, entries[start:end], nil)
		if errors.Is(err, badger.ErrTxnTooBig) && end-start > 1 {
			maxSize, maxCount = maxSize/2, max(maxCount/2, 1)
			continue
		}
		if err != nil {
			return err
		}
		start = end
	}
	return nil
}

// entrySize is Badger's estimate of what an entry costs a transaction.
func entrySize(e entry, threshold int64) int64 {
	key := int64(len(e.dev) + 1 + blockKeyLen)
	if int64(len(e.value)) < threshold {
		return key + int64(len(e.value)) + 2
	}
	return key + 12 + 2
}

// commitChunk commits entries, the deletion of the keys in drop and the
// updated table metadata in one transaction, as the next version of
// the table, which is also the sequence of the blocks written.
func commitChunk(t *table, entries []entry, drop [][]byte) error {
	w := t.tracker()
	if drop == nil {
		w.markOverlaps(entries)
	}
	version := t.ver.Reserve(t.db)
	txn := t.ver.WriteTxn(t.db)
	defer txn.Discard()
	added, newest := int64(0), t.newest
	for _, k := range drop {
		if err := txn.Delete(k); err != nil {
			return err
		}
	}
	for i := range entries {
		e := &entries[i]
		e.ref.seq = version
		if err := txn.SetEntry(badger.NewEntry(appendBlockKey(nil, e.dev, e.ref), e.value).WithMeta(e.meta)); err != nil {
			return err
		}
		added += e.added
		newest = max(newest, e.newest)
	}
	n := t.readings.Load() + added
	if added > 0 {
		if err := txn.Set(metaReadingsKey, binary.BigEndian.AppendUint64(nil, uint64(n))); err != nil {
			return err
		}
	}
	if newest != t.newest {
		if err := txn.Set(metaNewestKey, binary.BigEndian.AppendUint64(nil, uint64(newest))); err != nil {
			return err
		}
	}
	if !t.formatSaved {
		if err := txn.Set(metaFormatKey, []byte{formatVersion}); err != nil {
			return err
		}
	}
	if testHookTableWrite != nil { // as commitTxnAt
		testHookTableWrite("commit")
	}
	if err := t.ver.CommitAt(t.db, txn, version); err != nil {
		t.doubt(entries)
		return fmt.Errorf("commit: %w", err)
	}
	t.committed(entries, n, newest, drop == nil)
	return nil
}

// committed records a commit of entries that left n readings and the
// newest reading newest in t: in t's metadata, the write tracker, and,
// for a write, the compactor's notes (a compaction renotes its device
// itself). It must run under t.writeMu.
func (t *table) committed(entries []entry, n int64, newest buckets.Ticks, write bool) {
	t.readings.Store(n)
	t.newest = newest
	t.formatSaved = true
	t.comp.doubtful = false
	t.tracker().noteWritten(entries, newest)
	if write {
		t.noteBlocks(entries)
	}
}

// classify marks transient storage errors with buckets.ErrUnavailable
// so that callers retry them later instead of giving up.
func classify(err error) error {
	if err == nil || errors.Is(err, buckets.ErrUnavailable) {
		return err
	}
	msg := err.Error()
	switch {
	case errors.Is(err, badger.ErrBlockedWrites), errors.Is(err, badger.ErrDBClosed),
		errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT),
		strings.Contains(msg, syscall.ENOSPC.Error()), strings.Contains(msg, syscall.EDQUOT.Error()),
		strings.Contains(msg, badger.ErrBlockedWrites.Error()):
		return fmt.Errorf("%w: %w", buckets.ErrUnavailable, err)
	}
	return err
}

// commitTxn commits txn, a write transaction of t, as the next version
// and publishes it to readers once it completed. It must run under
// t.writeMu. A failed commit uses up its version.
func (t *table) commitTxn(txn *badger.Txn) error {
	return t.commitTxnAt(txn, t.ver.Reserve(t.db))
}

// commitTxnAt commits txn as version, from t.ver.Reserve, and
// publishes it to readers once it completed.
func (t *table) commitTxnAt(txn *badger.Txn, version uint64) error {
	if testHookTableWrite != nil {
		testHookTableWrite("commit")
	}
	return t.ver.CommitAt(t.db, txn, version)
}
