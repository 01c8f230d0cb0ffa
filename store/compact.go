package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
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
//   - open blocks of the same size tier (a factor of four) are merged
//     once there are compactTierBlocks of them, so a reading is
//     rewritten about log4(readings per window) times however small the
//     commits are;
//   - once a device has readings in a newer window, its open blocks are
//     merged and the windows before are sealed;
//   - on Close, and for a table that stopped being written, every
//     device's open blocks are merged into as few blocks as possible.
//
// Every merge also takes every block that overlaps a block it takes
// (a late or repeated reading), so merged blocks never overlap another
// block of their device and sequences keep deciding which copy of a
// reading wins.

// sealWindow is the time span one sealed block covers at most.
const sealWindow = buckets.Ticks(time.Hour / 100)

// testHookCompactCommit, when set (by tests), runs just before a
// compaction commits.
var testHookCompactCommit func()

// compactTierBlocks is how many open blocks of one size tier trigger a
// merge.
const compactTierBlocks = 4

// compactState is what the compactor has to look at in a table.
// Guarded by the table's writeMu.
type compactState struct {
	dirty   map[buckets.DeviceID]struct{} // devices with new open blocks
	scanAll bool                          // look at every device (open blocks may predate this opening)
	quietAt time.Time                     // when a quiet spell was last noticed
}

// noteBlocks records the devices that got open blocks.
func (t *table) noteBlocks(entries []entry) {
	for _, e := range entries {
		if e.ref.sealed {
			continue
		}
		if t.comp.dirty == nil {
			t.comp.dirty = make(map[buckets.DeviceID]struct{})
		}
		if _, ok := t.comp.dirty[e.dev]; !ok {
			t.comp.dirty[buckets.DeviceID(strings.Clone(string(e.dev)))] = struct{}{}
		}
	}
}

// windowStart is the start of the seal window holding k.
func windowStart(k buckets.Ticks) buckets.Ticks {
	return k - k%sealWindow // the tick epoch is a whole number of days before the Unix one
}

// compactor runs compactions of the writable tables every
// Options.CompactInterval until the store closes.
func (s *Store) compactor() {
	defer close(s.compactDone)
	tick := time.NewTicker(s.opts.CompactInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			s.compactAll(false)
		}
	}
}

// compactAll compacts every open writable table; full merges every
// device's open blocks (on Close and for tables that went quiet).
func (s *Store) compactAll(full bool) {
	ctx := context.Background()
	for _, d := range s.daysBetween(0, 1<<31-1, buckets.Desc) {
		s.mu.Lock()
		t := s.tables[d]
		ok := t != nil && t.db != nil && !t.readOnly && !t.dropping && t.busy == nil
		s.mu.Unlock()
		if !ok {
			continue
		}
		h, err := s.acquire(ctx, d, forRead)
		if err != nil || h == nil {
			continue
		}
		if !h.readOnly {
			quiet := !full && h.quietSince(s.now(), s.opts.CompactInterval*10)
			err := s.compactTable(h, full || quiet)
			if err != nil && !errors.Is(err, errStopping) {
				s.log.Error("compact day table", "table", d.String(), "err", err)
			}
		}
		s.release(h)
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
	dirty, scanAll := t.comp.dirty, t.comp.scanAll || full
	t.comp.dirty, t.comp.scanAll = nil, false
	t.writeMu.Unlock()
	devs := make([]buckets.DeviceID, 0, len(dirty))
	for d := range dirty {
		devs = append(devs, d)
	}
	if scanAll {
		more, err := devicesWithOpenBlocks(t)
		if err != nil {
			return err
		}
		devs = append(devs, more...)
	}
	slices.Sort(devs)
	devs = slices.Compact(devs)
	for i, dev := range devs {
		if s.stopping() && !full {
			t.writeMu.Lock()
			t.noteDirty(devs[i:])
			t.writeMu.Unlock()
			return errStopping
		}
		if err := s.compactDevice(t, dev, full); err != nil {
			return fmt.Errorf("device %s: %w", dev, err)
		}
	}
	return nil
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

// noteDirty marks devs for the next compaction. writeMu is held.
func (t *table) noteDirty(devs []buckets.DeviceID) {
	if t.comp.dirty == nil {
		t.comp.dirty = make(map[buckets.DeviceID]struct{})
	}
	for _, d := range devs {
		t.comp.dirty[d] = struct{}{}
	}
}

// devicesWithOpenBlocks lists the devices of t that have open blocks,
// reading keys only.
func devicesWithOpenBlocks(t *table) ([]buckets.DeviceID, error) {
	txn, done := t.readTxn()
	defer done()
	it := txn.NewIterator(badger.IteratorOptions{})
	defer it.Close()
	var devs []buckets.DeviceID
	for it.Rewind(); it.Valid(); it.Next() {
		dev, ref, ok := parseAnyBlockKey(it.Item().Key())
		if ok && !ref.sealed && (len(devs) == 0 || devs[len(devs)-1] != dev) {
			devs = append(devs, buckets.DeviceID(strings.Clone(string(dev))))
		}
	}
	return devs, nil
}

// keyedRef is a block and its key.
type keyedRef struct {
	blockRef
	key []byte
}

// compactDevice merges the blocks of dev in t that need it, in one
// transaction, under writeMu.
func (s *Store) compactDevice(t *table, dev buckets.DeviceID, full bool) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	refs, take, merged, err := readCompaction(t, dev, full)
	if err != nil || len(take) == 0 {
		return err
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
	s.metrics.compactions.Add(context.Background(), 1)
	return nil
}

// readCompaction lists the blocks of dev, picks those to merge and
// reads them, merged; take is empty when nothing needs merging. Its read
// ends before it returns, so that the commit's deletions fall below the
// discard version and Badger drops the merged blocks. writeMu is held.
func readCompaction(t *table, dev buckets.DeviceID, full bool) (refs, take []keyedRef, merged []buckets.Reading, err error) {
	txn, done := t.readTxn()
	defer done()
	err = eachBlock(txn, dev, 0, func(bi blockItem) (bool, error) {
		refs = append(refs, keyedRef{bi.ref, bi.item.KeyCopy(nil)})
		return true, nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	if take = planCompaction(refs, full); len(take) == 0 {
		return refs, nil, nil, nil
	}
	res := newResolver()
	for _, r := range take {
		item, err := txn.Get(r.key)
		if err != nil {
			return nil, nil, nil, err
		}
		rs, err := decodeItem(blockItem{ref: r.blockRef, item: item}, dev)
		if err != nil {
			return nil, nil, nil, err
		}
		res.add(rs, r.seq, 0, buckets.MaxTicks+1)
	}
	return refs, take, res.take(buckets.Asc, buckets.MaxTicks+1), nil
}

// planCompaction picks the blocks to merge from refs (newest first),
// or none: the open blocks that trigger a merge (triggered), and every
// block overlapping one of those (withOverlaps).
func planCompaction(refs []keyedRef, full bool) []keyedRef {
	take := triggered(refs, full)
	if take == nil {
		return nil
	}
	withOverlaps(refs, take)
	var out []keyedRef
	for i, r := range refs {
		if take[i] {
			out = append(out, r)
		}
	}
	return out
}

// tierOf is the size tier of a block: a factor of four per tier.
func tierOf(count int) int { return min(bits.Len(uint(count))/2, maxTier) }

// maxTier is the highest size tier.
const maxTier = 7

// triggered marks the open blocks of refs that must be merged now, or
// returns nil when none must.
func triggered(refs []keyedRef, full bool) []bool {
	var open []int
	var tiers [maxTier + 1]int
	for i, r := range refs {
		if !r.sealed {
			open = append(open, i)
			tiers[tierOf(r.count)]++
		}
	}
	if len(open) == 0 {
		return nil
	}
	current := windowStart(refs[0].newest)
	take := make([]bool, len(refs))
	any := false
	for _, i := range open {
		r := refs[i]
		tier := tierOf(r.count)
		switch {
		case full && (len(open) > 1 || r.oldest < current || overlapsOther(refs, i)):
			take[i], any = true, true
		case r.oldest < current, overlapsOther(refs, i):
			for _, j := range open {
				take[j], any = true, true
			}
		case tiers[tier] >= compactTierBlocks:
			for _, j := range open {
				if tierOf(refs[j].count) <= tier {
					take[j], any = true, true
				}
			}
		}
	}
	if !any {
		return nil
	}
	return take
}

// overlapsOther reports whether refs[i] overlaps another block.
func overlapsOther(refs []keyedRef, i int) bool {
	for j := range refs {
		if j != i && refs[i].overlaps(refs[j].blockRef) {
			return true
		}
	}
	return false
}

// withOverlaps adds to take every block that overlaps a taken one,
// until none is left.
func withOverlaps(refs []keyedRef, take []bool) {
	for changed := true; changed; {
		changed = false
		for i := range refs {
			if take[i] {
				continue
			}
			for j := range refs {
				if take[j] && refs[i].overlaps(refs[j].blockRef) {
					take[i], changed = true, true
					break
				}
			}
		}
	}
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
		entries = append(entries, entry{dev: dev, value: v, newest: -1, ref: blockRef{
			oldest: chunk[0].Ticks, newest: chunk[len(chunk)-1].Ticks, count: len(chunk),
			sealed: cut < n || win < current || cut == maxBlockReadings,
		}})
		merged = merged[cut:]
	}
	return entries, nil
}
