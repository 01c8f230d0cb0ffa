package store

import (
	"context"
	"fmt"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/replay"
)

// The stream positions and the tombstones of dropped days are kept by
// package replay; these are the store's doors to them.

// LoadPosition returns the position saved for stream, and false when
// none was saved.
func (s *Store) LoadPosition(ctx context.Context, stream string) (buckets.StreamPosition, bool, error) {
	if err := ctx.Err(); err != nil {
		return buckets.StreamPosition{}, false, err
	}
	r, ok, err := s.replay.Load(stream)
	if err != nil || !ok {
		return buckets.StreamPosition{}, false, err
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
	rec := replay.Position{Created: p.Created.UnixNano(), Seq: p.Seq}
	if s.opts.SyncWrites {
		if err := s.replay.Write(map[string]replay.Position{p.Stream: rec}); err != nil {
			return fmt.Errorf("save stream position: %w", err)
		}
		return nil
	}
	s.replay.SetPending(p.Stream, rec)
	if s.opts.SyncEvery <= 0 {
		s.syncAll() // no sync loop: sync now
	}
	return nil
}

// recordTombstone records that day was dropped now, after the writes
// that hold HoldDrops. A failure to save it is logged: the drop goes
// on (the operator asked for it), but a replay may then bring readings
// of the day back.
func (s *Store) recordTombstone(day buckets.Day) {
	if err := s.replay.RecordTombstone(day); err != nil {
		s.log.Error("tombstone of a dropped day not saved; a replay of the stream may write the day again",
			"day", day.String(), "err", err)
	}
}

// DroppedAt reports when the table of day was last dropped, if it was
// dropped within the time tombstones are kept.
func (s *Store) DroppedAt(day buckets.Day) (time.Time, bool) { return s.replay.DroppedAt(day) }

// Tombstones lists the recorded drops, ascending by day.
func (s *Store) Tombstones() []buckets.Tombstone { return s.replay.Tombstones() }

// HoldDrops keeps drops from recording their tombstones until release
// is called. A writer that skips readings of dropped days holds it from
// its check of DroppedAt until its Write returned, so a drop cannot
// slip between the two and have the write recreate the day.
func (s *Store) HoldDrops() (release func()) { return s.replay.HoldDrops() }
