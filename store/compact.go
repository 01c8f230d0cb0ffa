package store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
	"github.com/telemetryd/telemetryd/store/compactplan"
	"github.com/telemetryd/telemetryd/store/giveway"
	"github.com/telemetryd/telemetryd/store/resolve"
)

// The compactor merges the open blocks of a device, which commits
// write (one per device per commit), into sealed blocks, each covering
// at most one aligned window of time (sealWindow, aligned to the Unix
// epoch, so an hourly or daily aggregate bucket contains whole blocks
// and is answered from their headers) and at most maxBlockReadings
// readings. Each compaction of a device is one Badger transaction that
// deletes the blocks it read and writes the merged ones, so readers see
// either the old blocks or the new ones, never both or neither.
//
// When it merges, and what:
//   - open blocks of the same size tier (a factor of sixteen) are
//     merged once there are compactTierBlocks of them, so a reading is
//     rewritten about log16(readings per window) times however small
//     the commits are (one reading per device per commit: once into a
//     block of 16, once into one of 256, once when its window is
//     sealed);
//   - once a device has readings in a newer window, its open blocks are
//     merged and the windows before are sealed;
//   - on Close, and for a table that stopped being written, every
//     device's open blocks are merged into as few blocks as possible.
//
// The compactor does not list a device's blocks to find out whether
// one of these holds: commits keep a note per device (openNote) of the
// open blocks written since it last looked, and it looks only at the
// devices whose note says a merge may be due. Without the note it
// listed every device written in the last interval, every interval.
//
// Nor does it, most of the time, list the blocks of a device it merges.
// In a table that was empty when it was opened, the note lists every
// open block of its device (it is exact), and as long as every open
// block is newer than every sealed one, that list is all a merge needs,
// a full one too: sealed blocks do not take part, and open blocks that
// overlap each other are all in it. Listing the
// device's keys instead walks over the deletions of every small block
// merged before, which Badger keeps until its own compaction drops
// them: at one reading per message that walk was most of the
// compactor's time, and grew with the day. A device's blocks are
// listed from the keys again (and its note becomes exact) after the
// table is reopened, after a failed commit, while an open block is not
// newer than a sealed one (a reading later than its window was
// sealed), and past maxKnownBlocks.
//
// Every merge also takes every block that overlaps a block it takes
// (a late or repeated reading), so merged blocks never overlap another
// block of their device and sequences keep deciding which copy of a
// reading wins. An open block that overlaps another is merged with the
// blocks it overlaps at the next compaction, not with every open block
// of its device: when the two halves of a reading come in two line
// protocol requests, each request would otherwise rewrite every open
// block of the hour.

// sealWindow is the time span one sealed block covers at most.
const sealWindow = compactplan.Window

// compactTierBlocks is how many open blocks of one size tier trigger a
// merge.
const compactTierBlocks = compactplan.TierBlocks

// windowStart is the start of the seal window holding k.
func windowStart(k buckets.Ticks) buckets.Ticks { return compactplan.WindowStart(k) }

// testHookCompactCommit, when set (by tests), runs just before a
// compaction commits.
var testHookCompactCommit func()

// testHookListBlocks, when set (by tests), runs when a compaction
// lists a device's blocks from the keys.
var testHookListBlocks func()

// testHookTableWrite, when set (by tests), runs on the goroutine that
// writes to a day table, its rollups or its count file, just before:
// what is "commit" (a Badger transaction of the table), "rollup",
// "count" or "close" (the close of a writable database, which flushes
// it).
var testHookTableWrite func(what string)

// compactState is what the compactor has to look at in a table.
// Guarded by the table's writeMu.
type compactState struct {
	notes   map[buckets.DeviceID]*openNote // devices with open blocks
	scanAll bool                           // look at every device (open blocks may predate this opening)
	quietAt time.Time                      // when a quiet spell was last noticed
	// known: a device without a note has no open block, so a new note
	// is exact (the table was empty when it was opened, and no commit
	// failed since).
	known bool
	// listed is how many open blocks exact notes list, at most
	// maxKnownBlocks; held is the bytes of their values kept, at most
	// maxHeldValueBytes.
	listed int
	held   int
	// doubtful: a commit failed since the last one that succeeded. A
	// failed commit may have left blocks that become visible only with
	// the next commit, so a listing until then makes no exact note.
	doubtful bool
}

// maxHeldValueBytes bounds the values of open blocks that exact notes
// of one table keep, so that merging them reads nothing back. A Badger
// Get of a block key searches every level for a newer version and cost
// more than the listing it replaces; a value not kept is read with one. A variable so that tests can reach it.
var maxHeldValueBytes = 16 << 20

// maxKnownBlocks bounds the open blocks that exact notes of one table
// list (about 40 bytes each); past it new notes are not exact and their
// devices' blocks are listed from the keys. A variable so that tests
// can reach the bound.
var maxKnownBlocks = 1 << 18

// openNote is what the compactor knows of a device's open blocks
// without reading them.
type openNote struct {
	small int // open blocks of the lowest size tier
	// oldWin and newWin are the oldest and newest seal windows the
	// open blocks touch.
	oldWin, newWin buckets.Ticks
	// urgent: a block that may overlap another was written.
	urgent bool
	// exact: open is every open block of the device, in the order
	// written.
	exact bool
	open  []noteBlock
	// sealedNewest is the newest reading of the device's sealed blocks
	// that the note saw (-1: none). A merge from the note alone is only
	// right while every open block is newer: a merge of older open
	// blocks could span a sealed block it does not take.
	sealedNewest buckets.Ticks
}

// noteBlock is an open block an exact note lists, with its value if
// the note keeps it.
type noteBlock struct {
	ref   blockRef
	value []byte
}

// due reports whether a merge may be due for the device.
func (n *openNote) due() bool {
	return n.urgent || n.small >= compactTierBlocks || n.oldWin < n.newWin
}

// add records an open block.
func (n *openNote) add(r blockRef) {
	if compactplan.TierOf(r.count) == 0 {
		n.small++
	}
	n.oldWin = min(n.oldWin, windowStart(r.oldest))
	n.newWin = max(n.newWin, windowStart(r.newest))
}

// note returns the note of dev, making an empty one, exact when the
// table knows that dev has no open blocks.
func (t *table) note(dev buckets.DeviceID) *openNote {
	if n := t.comp.notes[dev]; n != nil {
		return n
	}
	return t.newNote(dev, t.comp.known)
}

// newNote makes the note of dev, which has no open blocks if exact.
func (t *table) newNote(dev buckets.DeviceID, exact bool) *openNote {
	if t.comp.notes == nil {
		t.comp.notes = make(map[buckets.DeviceID]*openNote)
	}
	n := &openNote{oldWin: buckets.MaxTicks, newWin: -1, exact: exact, sealedNewest: -1}
	t.comp.notes[buckets.DeviceID(strings.Clone(string(dev)))] = n
	return n
}

// noteOpen records an open block in n, whose value is value (or nil
// if not at hand), listing it if n is exact and the table's bound
// allows, else making n inexact. The value is kept while
// maxHeldValueBytes allows; it must not change afterwards.
func (t *table) noteOpen(n *openNote, r blockRef, value []byte) {
	n.add(r)
	if !n.exact {
		return
	}
	if t.comp.listed >= maxKnownBlocks {
		t.forget(n)
		return
	}
	if t.comp.held+len(value) > maxHeldValueBytes {
		value = nil
	}
	n.open = append(n.open, noteBlock{ref: r, value: value})
	t.comp.listed++
	t.comp.held += len(value)
}

// forget makes n inexact: its device's blocks are listed from the keys
// at its next compaction.
func (t *table) forget(n *openNote) {
	for _, b := range n.open {
		t.comp.held -= len(b.value)
	}
	t.comp.listed -= len(n.open)
	n.exact, n.open = false, nil
}

// doubt makes the notes of the devices of entries inexact, and new
// notes too, and drops the readings the write tracker keeps of them,
// after a commit of entries failed: what it left is not known for
// sure.
func (t *table) doubt(entries []entry) {
	t.comp.known, t.comp.doubtful = false, true
	w := t.tracker()
	for _, e := range entries {
		if n := t.comp.notes[e.dev]; n != nil {
			t.forget(n)
		}
		w.forgetLast(e.dev)
	}
}

// noteBlocks records the open blocks of a commit. A block that may
// overlap another one (a late or repeated reading: entry.overlaps,
// which commitChunk asks the write tracker before the commit) makes the
// device urgent.
func (t *table) noteBlocks(entries []entry) {
	for _, e := range entries {
		if e.ref.sealed {
			continue
		}
		n := t.note(e.dev)
		t.noteOpen(n, e.ref, e.value)
		if e.overlaps {
			n.urgent = true
		}
	}
}

// renote replaces the note of dev with one of what refs (every open
// block of the device, or every block, after a compaction looked at
// them) says, exact if exact. sealed is the newest reading of the
// device's sealed blocks not in refs (-1 if refs has them all).
func (t *table) renote(dev buckets.DeviceID, refs []keyedRef, exact bool, sealed buckets.Ticks) {
	if n := t.comp.notes[dev]; n != nil {
		t.forget(n)
		delete(t.comp.notes, dev)
	}
	for _, r := range refs {
		if r.sealed {
			sealed = max(sealed, r.newest)
		}
	}
	var n *openNote
	for _, r := range refs {
		if !r.sealed {
			if n == nil {
				n = t.newNote(dev, exact)
				n.sealedNewest = sealed
			}
			t.noteOpen(n, r.blockRef, r.value)
		}
	}
}

// knownBlocks returns the open blocks of dev, newest first as keys
// sort, and the newest reading of its sealed blocks, when its note is
// exact and every open block is newer than every sealed one: then no
// open block overlaps a sealed block, and no merge of them spans one,
// so sealed blocks take no part in a merge, a full one included. Open
// blocks that overlap each other (a late or repeated reading made the
// note urgent) are all in the list, so the merge takes them together.
// Otherwise it returns nil.
func (t *table) knownBlocks(dev buckets.DeviceID) ([]keyedRef, buckets.Ticks) {
	n := t.comp.notes[dev]
	if n == nil || !n.exact || len(n.open) == 0 {
		return nil, -1
	}
	refs := make([]keyedRef, len(n.open))
	for i, b := range n.open {
		if b.ref.oldest <= n.sealedNewest {
			return nil, -1
		}
		refs[i] = keyedRef{blockRef: b.ref, key: appendBlockKey(nil, dev, b.ref), value: b.value}
	}
	slices.SortFunc(refs, func(a, b keyedRef) int { return bytes.Compare(a.key, b.key) })
	return refs, n.sealedNewest
}

// compactor runs compactions of the writable tables every
// Options.CompactInterval, saves the counts of tables gone quiet, and
// settles the tables that the idle sweep hands over (settle.go), until
// the store closes.
func (s *Store) compactor() {
	defer close(s.compactDone)
	var syncing sync.WaitGroup
	defer syncing.Wait()
	if s.opts.SyncEvery > 0 && !s.opts.SyncWrites {
		syncing.Go(s.syncer) // syncloop.go
	}
	tick := time.NewTicker(s.opts.CompactInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			s.saveQuietCounts()
			if s.diskTight(true) {
				continue // no writes into the memtables' holes (health.go)
			}
			s.compactAll(false)
		case <-s.settles.Wake():
			s.settleQueued()
		}
	}
}

// compactAll compacts every open writable table; full merges every
// device's open blocks (on Close and for tables that went quiet).
func (s *Store) compactAll(full bool) {
	for _, d := range s.daysBetween(0, 1<<31-1, buckets.Desc) {
		s.mu.Lock()
		t := s.tables[d]
		held := t != nil && s.holdOpen(t)
		s.mu.Unlock()
		if !held {
			continue
		}
		quiet := !full && t.quietSince(s.now(), s.opts.CompactInterval*10)
		err := s.compactTable(t, full || quiet)
		if err != nil && !errors.Is(err, errStopping) {
			s.log.Error("compact day table", "day", d.String(), "err", err)
		}
		s.unhold(t)
	}
}

// errStopping ends a compaction early because the store is closing.
var errStopping = errors.New("store is closing")

// quietSince reports, once per quiet spell, that t was not written
// for d: then every device's open blocks are merged.
func (t *table) quietSince(now time.Time, d time.Duration) bool {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if now.Sub(t.lastCommit) < d || (!t.comp.quietAt.IsZero() && !t.comp.quietAt.Before(t.lastCommit)) {
		return false
	}
	t.comp.quietAt = now
	return true
}

// compactTable compacts the devices of t that need it; full looks at
// every device with open blocks and merges them all.
func (s *Store) compactTable(t *table, full bool) error {
	t.writeMu.Lock()
	scanAll := t.comp.scanAll || full
	t.comp.scanAll = false
	var devs []buckets.DeviceID
	for d, n := range t.comp.notes {
		if full || n.due() {
			devs = append(devs, d)
		}
	}
	t.writeMu.Unlock()
	if scanAll {
		more, err := devicesWithOpenBlocks(t)
		if err != nil {
			t.writeMu.Lock()
			t.comp.scanAll = true // the next compaction lists them again
			t.writeMu.Unlock()
			return err
		}
		devs = append(devs, more...)
	}
	slices.Sort(devs)
	devs = slices.Compact(devs)
	var first error
	failed := 0
	gw := giveway.NewRun(&s.queries)
	for i, dev := range devs {
		gw.Between(giveway.Now())
		if s.stopping() && !full {
			t.noteUrgent(devs[i:])
			return errStopping
		}
		if err := s.compactDevice(t, dev, full); err != nil {
			if failed++; first == nil {
				first = fmt.Errorf("device %s: %w", dev, err)
			}
			if t.retryLater(devs[i:], err) {
				break
			}
		}
	}
	if failed > 1 {
		return fmt.Errorf("%w (and %d more devices failed)", first, failed-1)
	}
	return first
}

// stopping reports whether Close has begun.
func (s *Store) stopping() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// retryLater marks devs[0], a device whose compaction failed with err,
// for the next compaction; when the table cannot be written at all, the
// devices after it too, and it reports that the compaction should stop.
// A device that fails otherwise (a block that does not decode, say) does
// not hold up the devices after it. A device that only the scan of the
// keys found has no note that would keep it due: it gets one.
func (t *table) retryLater(devs []buckets.DeviceID, err error) (stop bool) {
	stop = errors.Is(err, buckets.ErrUnavailable)
	if !stop {
		devs = devs[:1]
	}
	t.noteUrgent(devs)
	return stop
}

// noteUrgent marks devs for the next compaction; it takes writeMu.
func (t *table) noteUrgent(devs []buckets.DeviceID) {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	for _, d := range devs {
		t.note(d).urgent = true
	}
}

// devicesWithOpenBlocks lists the devices of t that have open blocks,
// reading keys only.
func devicesWithOpenBlocks(t *table) ([]buckets.DeviceID, error) { return devicesIn(t, true) }

// devicesIn lists the devices with blocks in t (only those with open
// blocks when openOnly), reading keys only.
func devicesIn(t *table, openOnly bool) ([]buckets.DeviceID, error) {
	txn, done := t.ver.ReadTxn(t.db)
	defer done()
	it := txn.NewIterator(badger.IteratorOptions{})
	defer it.Close()
	var devs []buckets.DeviceID
	for it.Rewind(); it.Valid(); it.Next() {
		dev, ref, ok := parseAnyBlockKey(it.Item().Key())
		if ok && (!openOnly || !ref.sealed) && (len(devs) == 0 || devs[len(devs)-1] != dev) {
			devs = append(devs, buckets.DeviceID(strings.Clone(string(dev))))
		}
	}
	return devs, nil
}

// keyedRef is a block and its key, and for an open block its value
// (read with the key, which spares a second lookup of the blocks a
// compaction takes: mostly open ones).
type keyedRef struct {
	blockRef
	key   []byte
	value []byte
}

// compactDevice merges the blocks of dev in t that need it, in one
// transaction, under writeMu.
func (s *Store) compactDevice(t *table, dev buckets.DeviceID, full bool) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	exact := !t.comp.doubtful
	refs, sealed, take, merged, err := readCompaction(t, dev, full)
	if t.bad.skip(context.Background(), t.day, dev, err) {
		// Merging around the corrupt block would reorder what it hides;
		// the device's blocks stay as they are until new writes note
		// it again.
		if n := t.comp.notes[dev]; n != nil {
			t.forget(n)
			delete(t.comp.notes, dev)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if len(take) == 0 {
		t.renote(dev, refs, exact, sealed)
		if full {
			s.rollCompacted(t, dev, compacted{after: refs, full: true})
		}
		return nil
	}
	drop := make([][]byte, 0, len(take))
	for _, r := range take {
		drop = append(drop, r.key)
	}
	newestAll := refs[0].newest // keys sort newest first
	entries, err := sealedEntries(dev, merged, windowStart(newestAll))
	if err != nil {
		return err
	}
	if testHookCompactCommit != nil {
		testHookCompactCommit()
	}
	if err := commitChunk(t, entries, drop); err != nil {
		return classify(fmt.Errorf("commit compaction: %w", err))
	}
	after := afterCompaction(dev, refs, take, entries)
	t.renote(dev, after, exact, sealed)
	s.metrics.Compactions.Add(context.Background(), 1)
	s.rollCompacted(t, dev, compacted{after: after, full: full, refs: refs, take: take, entries: entries, merged: merged, sealed: sealed})
	return nil
}

// readCompaction lists the blocks of dev, picks those to merge and
// reads them, merged; take is empty when nothing needs merging. Its read
// ends before it returns, so that the commit's deletions fall below the
// discard version and Badger drops the merged blocks. writeMu is held.
//
// The blocks come from the device's note when it knows them
// (knownBlocks; sealed is then the newest reading of the sealed blocks
// left out), else from its keys (sealed is -1); a block the note lists
// but the table lacks sends it to the keys too.
func readCompaction(t *table, dev buckets.DeviceID, full bool) (refs []keyedRef, sealed buckets.Ticks, take []keyedRef, merged []buckets.Reading, err error) {
	txn, done := t.ver.ReadTxn(t.db)
	defer done()
	if refs, sealed = t.knownBlocks(dev); refs != nil {
		take, merged, err = mergeTaken(txn, dev, refs, full)
		if !errors.Is(err, badger.ErrKeyNotFound) {
			return refs, sealed, take, merged, err
		}
		t.forget(t.comp.notes[dev])
	}
	if testHookListBlocks != nil {
		testHookListBlocks()
	}
	if refs, err = listBlocks(txn, dev); err != nil {
		return nil, -1, nil, nil, err
	}
	take, merged, err = mergeTaken(txn, dev, refs, full)
	return refs, -1, take, merged, err
}

// listBlocks lists every block of dev in txn, newest first, with the
// values of open blocks.
func listBlocks(txn *badger.Txn, dev buckets.DeviceID) ([]keyedRef, error) {
	var refs []keyedRef
	err := eachBlock(txn, dev, 0, func(bi blockItem) (bool, error) {
		kr := keyedRef{blockRef: bi.ref, key: bi.item.KeyCopy(nil)}
		if !bi.ref.sealed {
			var err error
			if kr.value, err = bi.item.ValueCopy(nil); err != nil {
				return false, err
			}
		}
		refs = append(refs, kr)
		return true, nil
	})
	return refs, err
}

// mergeTaken picks the blocks of refs to merge and reads them, merged;
// take is empty when nothing needs merging.
func mergeTaken(txn *badger.Txn, dev buckets.DeviceID, refs []keyedRef, full bool) (take []keyedRef, merged []buckets.Reading, err error) {
	if take = planCompaction(refs, full); len(take) == 0 {
		return nil, nil, nil
	}
	res := resolve.New()
	for _, r := range take {
		rs, err := decodeTaken(txn, r, dev)
		if err != nil {
			return nil, nil, err
		}
		res.Add(rs, r.seq, 0, buckets.MaxTicks+1)
	}
	return take, res.Take(buckets.Asc, buckets.MaxTicks+1), nil
}

// decodeTaken decodes a block a compaction takes, from the value read
// with its key or else from txn.
func decodeTaken(txn *badger.Txn, r keyedRef, dev buckets.DeviceID) ([]buckets.Reading, error) {
	if r.value == nil {
		item, err := txn.Get(r.key)
		if err != nil {
			return nil, err
		}
		return decodeItem(blockItem{ref: r.blockRef, item: item}, dev)
	}
	_, rs, err := block.Decode(r.value, dev)
	if err != nil {
		return nil, &blockError{ref: r.blockRef, err: err}
	}
	return rs, nil
}

// planCompaction picks the blocks to merge from refs (newest first),
// or none (compactplan.Take).
func planCompaction(refs []keyedRef, full bool) []keyedRef {
	bs := make([]compactplan.Block, len(refs))
	for i, r := range refs {
		bs[i] = r.planned()
	}
	take := compactplan.Take(bs, full)
	if take == nil {
		return nil
	}
	var out []keyedRef
	for i, r := range refs {
		if take[i] {
			out = append(out, r)
		}
	}
	return out
}

// planned is r as a compaction plan sees it.
func (r keyedRef) planned() compactplan.Block {
	return compactplan.Block{Oldest: r.oldest, Newest: r.newest, Count: r.count, Sealed: r.sealed}
}

// afterCompaction is the blocks of dev once a compaction replaced take
// (of refs, in the same order) with entries.
func afterCompaction(dev buckets.DeviceID, refs, take []keyedRef, entries []entry) []keyedRef {
	out := make([]keyedRef, 0, len(refs)-len(take)+len(entries))
	for _, r := range refs {
		if len(take) > 0 && string(take[0].key) == string(r.key) {
			take = take[1:]
			continue
		}
		out = append(out, r)
	}
	for _, e := range entries {
		out = append(out, keyedRef{blockRef: e.ref, key: appendBlockKey(nil, dev, e.ref), value: e.value})
	}
	return out
}

// sealedEntries cuts merged (sorted by ticks) into blocks: each within
// one seal window and at most maxBlockReadings readings. A block is
// sealed when it is full or its window is older than current (the
// window of the device's newest reading).
func sealedEntries(dev buckets.DeviceID, merged []buckets.Reading, current buckets.Ticks) ([]entry, error) {
	var entries []entry
	for len(merged) > 0 {
		win := windowStart(merged[0].Ticks)
		n, _ := slices.BinarySearchFunc(merged, win+sealWindow, func(r buckets.Reading, k buckets.Ticks) int { return cmp.Compare(r.Ticks, k) })
		cut := blockCut(merged[:n])
		chunk := merged[:cut]
		v, err := block.Encode(nil, chunk)
		if err != nil {
			return nil, err
		}
		entries = append(entries, entry{dev: dev, value: v, meta: blockMeta(chunk), newest: -1, ref: blockRef{
			oldest: chunk[0].Ticks, newest: chunk[len(chunk)-1].Ticks, count: len(chunk),
			sealed: cut < n || win < current || cut == maxBlockReadings,
		}})
		merged = merged[cut:]
	}
	return entries, nil
}
