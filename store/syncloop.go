package store

import (
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/badgeropts"
)

// A saved stream position vouches that every reading up to it is in
// the store, and a replay after a power cut starts after it. So,
// without SyncWrites, a position reaches the positions file only after
// the commits it vouches for were fsynced: SavePosition keeps it
// pending, and syncAll writes it once the tables and the index are
// synced. Written earlier, a power cut could keep the position and lose
// the readings, which the replay would then never bring back.

// The readings a position vouches for came from a stream that, in the
// same mode, syncs on its own timer. A position written before the
// stream synced the messages up to it can outlive them: after a power
// cut the stream ends below the position and gives the next messages
// the sequences of the lost ones, and a consumer created after the
// position would skip them, though they were acked after the cut. So
// the position also waits for the stream: SetPositionBarrier gives the
// sync loop a function that makes the stream's messages durable (the
// embedded server's SyncStreams), and syncAll calls it after the tables
// are synced and before it writes the positions.

// SetPositionBarrier makes f run before every write of pending stream
// positions in the sync loop; an error keeps them pending. f must make
// durable every message the store was handed so far. Nil removes it.
func (s *Store) SetPositionBarrier(f func() error) {
	if f == nil {
		s.barrier.Store(nil)
		return
	}
	s.barrier.Store(&f)
}

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
	pending := s.replay.TakePending()
	ok := true
	for _, d := range s.daysBetween(0, 1<<31-1, buckets.Desc) {
		s.mu.Lock()
		t := s.tables[d]
		held := t != nil && s.holdOpen(t) // open and writable; t.db is ours to read until unhold
		s.mu.Unlock()
		if !held {
			continue // a closed table was synced by its close
		}
		if err := errors.Join(t.db.Sync(), syncLogs(t.dir)); err != nil {
			s.log.Warn("sync day table", "day", d.String(), "err", err)
			ok = false
		}
		s.unhold(t)
	}
	if err := errors.Join(s.index.DB().Sync(), syncLogs(filepath.Join(s.dir, indexDirName))); err != nil {
		s.log.Warn("sync device index", "err", err)
		ok = false
	}
	if !ok {
		s.replay.RestorePending(pending)
		return
	}
	if b := s.barrier.Load(); b != nil && len(pending) > 0 {
		if err := (*b)(); err != nil {
			s.log.Warn("sync the streams before saving stream positions", "err", err)
			s.replay.RestorePending(pending)
			return
		}
	}
	if err := s.replay.Write(pending); err != nil {
		s.log.Warn("save stream positions", "err", err)
		s.replay.RestorePending(pending)
	}
}

// syncLogs fsyncs the logs of the Badger database in dir and dir
// itself (badgeropts.SyncLogs).
func syncLogs(dir string) error { return badgeropts.SyncLogs(dir, fsyncFile) }

// fsyncFile fsyncs one file by its path (tests record the calls).
var fsyncFile = func(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	return errors.Join(f.Sync(), f.Close())
}
