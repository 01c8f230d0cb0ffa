package store

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
)

// tombstonesFileName is the file under the data directory listing the
// dropped days and when each was dropped. It is replaced atomically.
const tombstonesFileName = "TOMBSTONES"

// tombstoneKeep is how long a tombstone is kept. A tombstone matters
// while the stream may still hold messages published before the drop
// (the stream's max age, 7 days by default) and while the day is inside
// the accepted window (older readings are rejected as too_old anyway);
// 400 days outlasts both at any sensible setting.
const tombstoneKeep = 400 * 24 * time.Hour

// tombstoneRecord is one entry of the tombstones file.
type tombstoneRecord struct {
	Day     string    `json:"day"`
	Dropped time.Time `json:"dropped"`
}

// loadTombstones reads the tombstones file into memory (at Open).
func (s *Store) loadTombstones() error {
	b, err := os.ReadFile(filepath.Join(s.dir, tombstonesFileName))
	tombs := map[buckets.Day]time.Time{}
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read tombstones: %w", err)
	default:
		var recs []tombstoneRecord
		if err := json.Unmarshal(b, &recs); err != nil {
			return fmt.Errorf("read tombstones %s: %w", filepath.Join(s.dir, tombstonesFileName), err)
		}
		for _, r := range recs {
			day, err := buckets.ParseDay(r.Day)
			if err != nil {
				return fmt.Errorf("read tombstones: %w", err)
			}
			tombs[day] = r.Dropped
		}
	}
	s.replay.tombMu.Lock()
	s.replay.tombs = tombs
	s.replay.tombMu.Unlock()
	return nil
}

// recordTombstone records that day was dropped now (the wall clock). It waits for the
// writes that hold the gate (HoldDrops), so that each of them either
// completed before the drop or sees the tombstone. A failure to save
// it is logged: the drop goes on (the operator asked for it), but a
// replay may then bring readings of the day back.
func (s *Store) recordTombstone(day buckets.Day) {
	s.replay.gate.Lock()
	defer s.replay.gate.Unlock()
	// Wall-clock time, not the store's clock: it is compared with the
	// time the NATS server stored each message.
	now := time.Now()
	s.replay.tombMu.Lock()
	defer s.replay.tombMu.Unlock()
	next := make(map[buckets.Day]time.Time, len(s.replay.tombs)+1)
	for d, at := range s.replay.tombs {
		if now.Sub(at) < tombstoneKeep {
			next[d] = at
		}
	}
	next[day] = now
	s.replay.tombs = next
	recs := make([]tombstoneRecord, 0, len(next))
	for _, d := range slices.Sorted(maps.Keys(next)) {
		recs = append(recs, tombstoneRecord{Day: d.String(), Dropped: next[d].UTC()})
	}
	b, err := json.Marshal(recs)
	if err == nil {
		err = replaceFile(s.dir, tombstonesFileName, b)
	}
	if err != nil {
		s.log.Error("tombstone of a dropped day not saved; a replay of the stream may write the day again",
			"day", day.String(), "err", err)
	}
}

// DroppedAt reports when the table of day was last dropped, if it was
// dropped within the time tombstones are kept.
func (s *Store) DroppedAt(day buckets.Day) (time.Time, bool) {
	s.replay.tombMu.Lock()
	at, ok := s.replay.tombs[day]
	s.replay.tombMu.Unlock()
	return at, ok
}

// Tombstones lists the recorded drops, ascending by day.
func (s *Store) Tombstones() []buckets.Tombstone {
	s.replay.tombMu.Lock()
	defer s.replay.tombMu.Unlock()
	out := make([]buckets.Tombstone, 0, len(s.replay.tombs))
	for _, d := range slices.Sorted(maps.Keys(s.replay.tombs)) {
		out = append(out, buckets.Tombstone{Day: d, Dropped: s.replay.tombs[d]})
	}
	return out
}

// HoldDrops keeps drops from recording their tombstones until release
// is called. A writer that skips readings of dropped days holds it from
// its check of DroppedAt until its Write returned, so a drop cannot
// slip between the two and have the write recreate the day.
func (s *Store) HoldDrops() (release func()) {
	s.replay.gate.RLock()
	return s.replay.gate.RUnlock
}
