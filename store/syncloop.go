package store

import (
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// A saved stream position vouches that every reading up to it is in
// the store, and a replay after a power cut starts after it. So,
// without SyncWrites, a position reaches the positions file only after
// the commits it vouches for were fsynced: SavePosition keeps it
// pending, and syncAll writes it once the tables and the index are
// synced. Written earlier, a power cut could keep the position and lose
// the readings, which the replay would then never bring back.

// syncer runs syncAll every Options.SyncEvery until the store closes. It
// has its own goroutine so a long compaction does not stretch the
// interval, which bounds what a power cut can take.
func (s *Store) syncer() {
	tick := time.NewTicker(s.opts.SyncEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			s.syncAll()
		}
	}
}

// syncAll fsyncs every open writable day table and the device index,
// then writes the positions that were pending when it began: every
// commit they vouch for came before them, so the fsyncs cover it. A
// failed fsync leaves them pending.
func (s *Store) syncAll() {
	pending := s.replay.takePending()
	ok := true
	for _, d := range s.daysBetween(0, 1<<31-1, buckets.Desc) {
		s.mu.Lock()
		t := s.tables[d]
		held := t != nil && s.holdOpen(t) // open and writable; t.db is ours to read until unhold
		s.mu.Unlock()
		if !held {
			continue // a closed table was synced by its close
		}
		if err := t.db.Sync(); err != nil {
			s.log.Warn("sync day table", "day", d.String(), "err", err)
			ok = false
		}
		s.unhold(t)
	}
	if err := s.index.db.Sync(); err != nil {
		s.log.Warn("sync device index", "err", err)
		ok = false
	}
	if !ok {
		s.replay.restorePending(pending)
		return
	}
	if err := s.writePositions(pending); err != nil {
		s.log.Warn("save stream positions", "err", err)
		s.replay.restorePending(pending)
	}
}

// takePending returns the pending positions and forgets them.
func (r *replayState) takePending() map[string]positionRecord {
	r.posMu.Lock()
	defer r.posMu.Unlock()
	p := r.pending
	r.pending = nil
	return p
}

// restorePending puts back positions whose write failed, unless one
// saved since is pending for the stream.
func (r *replayState) restorePending(p map[string]positionRecord) {
	r.posMu.Lock()
	defer r.posMu.Unlock()
	for name, rec := range p {
		if _, newer := r.pending[name]; newer {
			continue
		}
		if r.pending == nil {
			r.pending = map[string]positionRecord{}
		}
		r.pending[name] = rec
	}
}

// setPending makes rec the pending position of stream.
func (r *replayState) setPending(stream string, rec positionRecord) {
	r.posMu.Lock()
	defer r.posMu.Unlock()
	if r.pending == nil {
		r.pending = map[string]positionRecord{}
	}
	r.pending[stream] = rec
}
