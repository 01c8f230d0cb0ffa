package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// positionsFileName is the file under the data directory that records,
// per stream, the sequence the store has settled up to (see
// SavePosition). It is replaced atomically (write, fsync, rename).
const positionsFileName = "POSITIONS"

// positionRecord is one stream's entry in the positions file.
type positionRecord struct {
	Created int64  `json:"created_unix_nano"`
	Seq     uint64 `json:"seq"`
}

// replayState is what the store keeps so that a replay of the stream
// neither starts over nor resurrects dropped days: the positions file
// and the tombstones (tombstone.go).
type replayState struct {
	posMu sync.Mutex // serializes reads and writes of the positions file
	// pending are positions saved but not yet written, without
	// SyncWrites: they wait for the fsync of what they vouch for
	// (syncloop.go). Guarded by posMu.
	pending map[string]positionRecord

	// gate is held shared by writers that checked the tombstones
	// (HoldDrops) and exclusively while a drop records its tombstone,
	// so a write either finished before the drop took the table or
	// sees the tombstone.
	gate   sync.RWMutex
	tombMu sync.Mutex
	tombs  map[buckets.Day]time.Time // guarded by tombMu; replaced, never mutated
}

// LoadPosition returns the position saved for stream, and false when
// none was saved.
func (s *Store) LoadPosition(ctx context.Context, stream string) (buckets.StreamPosition, bool, error) {
	if err := ctx.Err(); err != nil {
		return buckets.StreamPosition{}, false, err
	}
	s.replay.posMu.Lock()
	defer s.replay.posMu.Unlock()
	r, ok := s.replay.pending[stream]
	if !ok {
		all, err := readPositions(s.dir)
		if err != nil {
			return buckets.StreamPosition{}, false, err
		}
		r, ok = all[stream]
	}
	if !ok {
		return buckets.StreamPosition{}, false, nil
	}
	return buckets.StreamPosition{Stream: stream, Created: time.Unix(0, r.Created).UTC(), Seq: r.Seq}, true, nil
}

// SavePosition records that every message of p.Stream up to p.Seq is
// settled (committed or dead-lettered). The file is replaced
// atomically and synced, so after a crash it holds either the old or
// the new position, never a torn one. With SyncWrites the commits are
// already fsynced and the file is written now; without, the position
// is written by the next syncAll, after the fsync of the commits it
// vouches for (syncloop.go), so a power cut never keeps a position
// whose readings it lost. LoadPosition sees it at once.
func (s *Store) SavePosition(ctx context.Context, p buckets.StreamPosition) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.opts.ReadOnly {
		return fmt.Errorf("save stream position: %w", errReadOnly)
	}
	rec := positionRecord{Created: p.Created.UnixNano(), Seq: p.Seq}
	if s.opts.SyncWrites {
		if err := s.writePositions(map[string]positionRecord{p.Stream: rec}); err != nil {
			return fmt.Errorf("save stream position: %w", err)
		}
		return nil
	}
	s.replay.setPending(p.Stream, rec)
	if s.opts.SyncEvery <= 0 {
		s.syncAll() // no sync loop: sync now
	}
	return nil
}

// writePositions replaces the positions file with its records updated
// by recs.
func (s *Store) writePositions(recs map[string]positionRecord) error {
	if len(recs) == 0 {
		return nil
	}
	s.replay.posMu.Lock()
	defer s.replay.posMu.Unlock()
	all, err := readPositions(s.dir)
	if err != nil {
		all = map[string]positionRecord{} // a damaged file is replaced
	}
	for name, rec := range recs {
		all[name] = rec
	}
	b, err := json.Marshal(all)
	if err != nil {
		return err
	}
	return replaceFile(s.dir, positionsFileName, b)
}

// readPositions reads the positions file; a missing file is empty.
func readPositions(dir string) (map[string]positionRecord, error) {
	b, err := os.ReadFile(filepath.Join(dir, positionsFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]positionRecord{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read stream positions: %w", err)
	}
	all := map[string]positionRecord{}
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, fmt.Errorf("read stream positions %s: %w", filepath.Join(dir, positionsFileName), err)
	}
	return all, nil
}

// replaceFile atomically replaces dir/name with b: it writes and syncs
// a temporary file, renames it over name and syncs dir.
func replaceFile(dir, name string, b []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	if err := writeSynced(tmp, b); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}
