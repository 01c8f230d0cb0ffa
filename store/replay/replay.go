// Package replay keeps what lets a replay of the stream neither start
// over nor write dropped days again: per stream the position the store
// has settled up to (the positions file, and the positions that wait
// for the fsync of what they vouch for), the tombstones of the dropped
// days (the tombstones file, and the gate that orders writes and
// drops), and the tombstones of deleted devices (in the device index
// database). Both files sit under the data directory and are replaced
// whole (package atomicfile).
package replay

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/atomicfile"
)

// PositionsFileName is the file under the data directory that records,
// per stream, the sequence the store has settled up to. It is replaced
// atomically (write, fsync, rename).
const PositionsFileName = "POSITIONS"

// Position is one stream's entry in the positions file.
type Position struct {
	Created int64  `json:"created_unix_nano"`
	Seq     uint64 `json:"seq"`
}

// State is the positions and tombstones of one data directory.
type State struct {
	dir   string
	posMu sync.Mutex // serializes reads and writes of the positions file
	// pending are positions saved but not yet written: they wait for
	// the fsync of what they vouch for. Guarded by posMu.
	pending map[string]Position

	// gate is held shared by writers that checked the tombstones
	// (HoldDrops) and exclusively while a drop records its tombstone,
	// so a write either finished before the drop took the table or
	// sees the tombstone.
	gate   sync.RWMutex
	tombMu sync.Mutex
	tombs  map[buckets.Day]time.Time // guarded by tombMu; replaced, never mutated
}

// New returns the state of the data directory dir; LoadTombstones
// reads its tombstones.
func New(dir string) *State { return &State{dir: dir} }

// Load returns the position saved for stream (pending or written), and
// false when none was saved.
func (r *State) Load(stream string) (Position, bool, error) {
	r.posMu.Lock()
	defer r.posMu.Unlock()
	p, ok := r.pending[stream]
	if !ok {
		all, err := ReadPositions(r.dir)
		if err != nil {
			return Position{}, false, err
		}
		p, ok = all[stream]
	}
	return p, ok, nil
}

// Written reads the positions file (not the pending positions).
func (r *State) Written() (map[string]Position, error) {
	r.posMu.Lock()
	defer r.posMu.Unlock()
	return ReadPositions(r.dir)
}

// Write replaces the positions file with its records updated by recs.
func (r *State) Write(recs map[string]Position) error {
	if len(recs) == 0 {
		return nil
	}
	r.posMu.Lock()
	defer r.posMu.Unlock()
	all, err := ReadPositions(r.dir)
	if err != nil {
		all = map[string]Position{} // a damaged file is replaced
	}
	for name, rec := range recs {
		all[name] = rec
	}
	return WritePositions(r.dir, all)
}

// ReadPositions reads the positions file of the data directory dir; a
// missing file is empty.
func ReadPositions(dir string) (map[string]Position, error) {
	b, err := os.ReadFile(filepath.Join(dir, PositionsFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]Position{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read stream positions: %w", err)
	}
	all := map[string]Position{}
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, fmt.Errorf("read stream positions %s: %w", filepath.Join(dir, PositionsFileName), err)
	}
	return all, nil
}

// WritePositions replaces the positions file of the data directory dir
// with all.
func WritePositions(dir string, all map[string]Position) error {
	b, err := json.Marshal(all)
	if err != nil {
		return err
	}
	return atomicfile.Replace(dir, PositionsFileName, b)
}

// TakePending returns the pending positions and forgets them.
func (r *State) TakePending() map[string]Position {
	r.posMu.Lock()
	defer r.posMu.Unlock()
	p := r.pending
	r.pending = nil
	return p
}

// RestorePending puts back positions whose write failed, unless one
// saved since is pending for the stream.
func (r *State) RestorePending(p map[string]Position) {
	r.posMu.Lock()
	defer r.posMu.Unlock()
	for name, rec := range p {
		if _, newer := r.pending[name]; newer {
			continue
		}
		if r.pending == nil {
			r.pending = map[string]Position{}
		}
		r.pending[name] = rec
	}
}

// SetPending makes rec the pending position of stream.
func (r *State) SetPending(stream string, rec Position) {
	r.posMu.Lock()
	defer r.posMu.Unlock()
	if r.pending == nil {
		r.pending = map[string]Position{}
	}
	r.pending[stream] = rec
}
