package replay

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/atomicfile"
)

// TombstonesFileName is the file under the data directory listing the
// dropped days and when each was dropped. It is replaced atomically.
const TombstonesFileName = "TOMBSTONES"

// TombstoneKeep is how long a tombstone is kept. A tombstone matters
// while the stream may still hold messages published before the drop
// (the stream's max age, 7 days by default) and while the day is inside
// the accepted window (older readings are rejected as too_old anyway);
// 400 days outlasts both at any sensible setting.
const TombstoneKeep = 400 * 24 * time.Hour

// TombstoneRecord is one entry of the tombstones file.
type TombstoneRecord struct {
	Day     string    `json:"day"`
	Dropped time.Time `json:"dropped"`
}

// WriteTombstones replaces the tombstones file of the data directory
// dir with recs.
func WriteTombstones(dir string, recs []TombstoneRecord) error {
	b, err := json.Marshal(recs)
	if err != nil {
		return err
	}
	return atomicfile.Replace(dir, TombstonesFileName, b)
}

// LoadTombstones reads the tombstones file into memory (at Open).
func (r *State) LoadTombstones() error {
	b, err := os.ReadFile(filepath.Join(r.dir, TombstonesFileName))
	tombs := map[buckets.Day]time.Time{}
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read tombstones: %w", err)
	default:
		var recs []TombstoneRecord
		if err := json.Unmarshal(b, &recs); err != nil {
			return fmt.Errorf("read tombstones %s: %w", filepath.Join(r.dir, TombstonesFileName), err)
		}
		for _, rec := range recs {
			day, err := buckets.ParseDay(rec.Day)
			if err != nil {
				return fmt.Errorf("read tombstones: %w", err)
			}
			tombs[day] = rec.Dropped
		}
	}
	r.tombMu.Lock()
	r.tombs = tombs
	r.tombMu.Unlock()
	return nil
}

// RecordTombstone records that day was dropped now (the wall clock). It
// waits for the writes that hold the gate (HoldDrops), so that each of
// them either completed before the drop or sees the tombstone. It
// returns an error when the file was not saved; the tombstone is kept
// in memory all the same.
func (r *State) RecordTombstone(day buckets.Day) error {
	r.gate.Lock()
	defer r.gate.Unlock()
	// Wall-clock time, not the store's clock: it is compared with the
	// time the NATS server stored each message.
	now := time.Now()
	r.tombMu.Lock()
	defer r.tombMu.Unlock()
	next := make(map[buckets.Day]time.Time, len(r.tombs)+1)
	for d, at := range r.tombs {
		if now.Sub(at) < TombstoneKeep {
			next[d] = at
		}
	}
	next[day] = now
	r.tombs = next
	recs := make([]TombstoneRecord, 0, len(next))
	for _, d := range slices.Sorted(maps.Keys(next)) {
		recs = append(recs, TombstoneRecord{Day: d.String(), Dropped: next[d].UTC()})
	}
	return WriteTombstones(r.dir, recs)
}

// DroppedAt reports when the table of day was last dropped, if it was
// dropped within the time tombstones are kept.
func (r *State) DroppedAt(day buckets.Day) (time.Time, bool) {
	r.tombMu.Lock()
	at, ok := r.tombs[day]
	r.tombMu.Unlock()
	return at, ok
}

// Tombstones lists the recorded drops, ascending by day.
func (r *State) Tombstones() []buckets.Tombstone {
	r.tombMu.Lock()
	defer r.tombMu.Unlock()
	out := make([]buckets.Tombstone, 0, len(r.tombs))
	for _, d := range slices.Sorted(maps.Keys(r.tombs)) {
		out = append(out, buckets.Tombstone{Day: d, Dropped: r.tombs[d]})
	}
	return out
}

// HoldDrops keeps drops from recording their tombstones until release
// is called.
func (r *State) HoldDrops() (release func()) {
	r.gate.RLock()
	return r.gate.RUnlock
}

// LockDrops holds the gate exclusively, as a drop does while it records
// its tombstone, until unlock is called: a delete that must not slip
// between a writer's check and its write holds it.
func (r *State) LockDrops() (unlock func()) {
	r.gate.Lock()
	return r.gate.Unlock
}
