package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/buckets"
)

// Replay never resurrects. Two things keep a replay of the stream from
// writing what storage already settled or deliberately dropped:
//
//   - Positions: the consumer's ack floor (every message at or below it
//     was committed or dead-lettered) is saved every PositionEvery while
//     it moves and once more at shutdown. When the durable consumer is
//     missing (deleted by hand, or lost with the server's state) it is
//     created to deliver from the saved sequence + 1 instead of the
//     whole stream. A position saved for an earlier stream of the same
//     name (its creation time differs) is ignored. The saved floor may
//     lag the real one by up to PositionEvery; what lies between is
//     delivered again and written idempotently (same keys, same values).
//   - Tombstones: a day dropped by hand, by the size guard or by
//     retention is recorded with its drop time. A reading of that day in
//     a message the stream stored (its JetStream timestamp) before the
//     drop is skipped: the message is acked, the reading counted in
//     telemetry.ingest.readings with outcome "skipped" and code
//     day_dropped. Readings of the day in messages published after the
//     drop are new data and are stored. The check and the write hold
//     the store's drop gate (HoldDrops), so a drop cannot fall between
//     them.
//   - Device tombstones: a deleted device is recorded with its delete
//     time. Its readings and attribute assignments in a message the
//     stream stored before the delete are skipped the same way (code
//     device_deleted); what it publishes after the delete is stored. A
//     delete holds the gate from its tombstone to its last removal, so
//     a write either finished before the delete began (and is removed
//     by it) or sees the tombstone.

// finalPositionTimeout bounds the position saved at shutdown.
const finalPositionTimeout = time.Second

// Positions keeps the stream sequence storage has settled up to
// (implemented by store.Store).
type Positions interface {
	// LoadPosition returns the saved position of stream; false when
	// none was saved.
	LoadPosition(ctx context.Context, stream string) (buckets.StreamPosition, bool, error)
	// SavePosition durably replaces the saved position of p.Stream.
	SavePosition(ctx context.Context, p buckets.StreamPosition) error
}

// Tombstones reports the days dropped from storage and the devices
// deleted (implemented by store.Store).
type Tombstones interface {
	// DroppedAt is when the table of day was last dropped.
	DroppedAt(day buckets.Day) (time.Time, bool)
	// DeletedAt is when dev was last deleted.
	DeletedAt(dev buckets.DeviceID) (time.Time, bool)
	// HoldDrops keeps drops from recording a tombstone until release
	// is called.
	HoldDrops() (release func())
}

// startPosition sets where a consumer about to be created starts. An
// existing consumer keeps its deliver policy (the server refuses to
// change it); a missing one starts after the saved position, when
// there is a valid one.
func (in *Ingester) startPosition(ctx context.Context, st jetstream.Stream, cfg *jetstream.ConsumerConfig) error {
	existing, err := in.js.Consumer(ctx, in.cfg.Stream, in.cfg.Consumer)
	switch {
	case err == nil:
		c := existing.CachedInfo().Config
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = c.DeliverPolicy, c.OptStartSeq, c.OptStartTime
		return nil
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return fmt.Errorf("look up consumer %s: %w", in.cfg.Consumer, err)
	}
	if in.cfg.Positions == nil {
		return nil
	}
	pos, ok, err := in.cfg.Positions.LoadPosition(ctx, in.cfg.Stream)
	if err != nil {
		in.log.Warn("saved stream position unreadable; the new consumer starts at the beginning of the stream",
			"stream", in.cfg.Stream, "err", err)
		return nil
	}
	if !ok || pos.Seq == 0 {
		return nil
	}
	if created := st.CachedInfo().Created; !pos.Created.Equal(created) {
		if in.cfg.Restored {
			in.log.Info("restored data: reading the stream from its beginning (the backup was taken against an earlier stream of that name)",
				"stream", in.cfg.Stream, "saved_seq", pos.Seq, "saved_created", pos.Created, "stream_created", created)
			return nil
		}
		in.log.Warn("saved stream position belongs to an earlier stream of that name; starting at the beginning",
			"stream", in.cfg.Stream, "saved_seq", pos.Seq, "saved_created", pos.Created, "stream_created", created)
		return nil
	}
	cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
	cfg.OptStartSeq = pos.Seq + 1
	in.log.Info("creating the consumer after the saved stream position", "stream", in.cfg.Stream,
		"consumer", in.cfg.Consumer, "start_seq", cfg.OptStartSeq)
	return nil
}

// savePositions saves the consumer's ack floor every PositionEvery
// while it moves, until ctx is done.
func (in *Ingester) savePositions(ctx context.Context) {
	if in.cfg.Positions == nil {
		return
	}
	every(ctx, in.cfg.PositionEvery, func() { in.savePosition(ctx) })
}

// savePosition saves the consumer's current ack floor if it moved.
func (in *Ingester) savePosition(ctx context.Context) {
	if in.cfg.Positions == nil {
		return
	}
	in.mu.Lock()
	cons, st := in.cons, in.stream
	in.mu.Unlock()
	if cons == nil || st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	info, err := cons.Info(ctx)
	if err != nil {
		in.log.Debug("consumer info for the stream position", "err", err)
		return
	}
	pos := buckets.StreamPosition{Stream: in.cfg.Stream, Created: st.CachedInfo().Created, Seq: info.AckFloor.Stream}
	if pos == in.saved || pos.Seq == 0 {
		return
	}
	if err := in.cfg.Positions.SavePosition(ctx, pos); err != nil {
		in.log.Warn("save stream position", "stream_seq", pos.Seq, "err", err)
		return
	}
	in.saved = pos
}

// skipDropped removes from items the readings of dropped days and the
// readings and attribute assignments of deleted devices that their
// message was published before the drop or delete, acks the messages
// left without readings and returns the rest with their reading count.
// The caller holds the drop gate.
func (in *Ingester) skipDropped(ctx context.Context, items []item, n int) ([]item, int) {
	tombs := in.cfg.Tombstones
	var kept []item
	for i, it := range items {
		drop, gone := droppedBefore(tombs, it), deletedBefore(tombs, it)
		if drop == nil && gone == nil {
			if kept != nil {
				kept = append(kept, it)
			}
			continue
		}
		if kept == nil {
			kept = append(make([]item, 0, len(items)), items[:i]...)
		}
		rs := make([]buckets.Reading, 0, len(it.readings))
		var dayDropped, deleted int
		for _, r := range it.readings {
			switch {
			case gone[r.Device]:
				deleted++
			case drop[r.Day()]:
				dayDropped++
			default:
				rs = append(rs, r)
			}
		}
		if gone != nil {
			var as []buckets.Assignment
			for _, a := range it.assigns {
				if !gone[a.Device] {
					as = append(as, a)
				}
			}
			it.assigns = as
		}
		n -= dayDropped + deleted
		if dayDropped > 0 {
			in.m.readings.Add(ctx, int64(dayDropped), in.m.skippedDropped)
		}
		if deleted > 0 {
			in.m.readings.Add(ctx, int64(deleted), in.m.skippedDeleted)
		}
		in.log.Debug("readings of a dropped day or a deleted device skipped", "subject", it.msg.Subject(),
			"stream_seq", it.seq, "day_dropped", dayDropped, "device_deleted", deleted)
		// A message whose readings were all skipped is settled; one that
		// carried only attribute assignments keeps those left.
		if len(rs) == 0 && (len(it.readings) > 0 || len(it.assigns) == 0) {
			if err := in.ack(ctx, it); err != nil {
				in.log.Warn("ack of a message of a dropped day failed; it will be redelivered and skipped again",
					"stream_seq", it.seq, "err", err)
				continue
			}
			in.m.messages.Add(ctx, 1, in.m.acked)
			continue
		}
		it.readings = rs
		kept = append(kept, it)
	}
	if kept == nil {
		return items, n
	}
	return kept, n
}

// droppedBefore returns the days of it's readings whose table was
// dropped after the message was published, or nil.
func droppedBefore(tombs Tombstones, it item) map[buckets.Day]bool {
	var out map[buckets.Day]bool
	last, lastDropped := buckets.Day(-1), false
	for _, r := range it.readings {
		d := r.Day()
		if d != last {
			at, ok := tombs.DroppedAt(d)
			last, lastDropped = d, ok && at.After(it.published)
		}
		if lastDropped {
			if out == nil {
				out = map[buckets.Day]bool{}
			}
			out[d] = true
		}
	}
	return out
}

// deletedBefore returns the devices of it's readings and attribute
// assignments that were deleted after the message was published, or
// nil.
func deletedBefore(tombs Tombstones, it item) map[buckets.DeviceID]bool {
	var out map[buckets.DeviceID]bool
	var last buckets.DeviceID
	checked, lastGone := false, false
	check := func(d buckets.DeviceID) {
		if !checked || d != last {
			at, ok := tombs.DeletedAt(d)
			last, lastGone, checked = d, ok && at.After(it.published), true
		}
		if lastGone {
			if out == nil {
				out = map[buckets.DeviceID]bool{}
			}
			out[d] = true
		}
	}
	for _, r := range it.readings {
		check(r.Device)
	}
	for _, a := range it.assigns {
		check(a.Device)
	}
	return out
}

// every calls fn every d until ctx is done.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
