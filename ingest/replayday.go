package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/wire"
	"github.com/telemetryd/telemetryd/ingest/lpwire"
)

// ReplayDay writes again the readings of day that the readings stream
// of cfg still holds, acked or not, for a day table rebuilt by a repair
// (store.RepairTable): what the damaged table held and the stream still
// has comes back. It reads the stream from its first message to the
// last one at the call with an ordered consumer of its own (the
// ingester's consumer is untouched), decodes each message as the
// ingester does, keeps the readings of day and writes them in batches.
// A message that does not decode is left to the ingester (which
// dead-letters it); readings of a device deleted after the message was
// stored (tombs) are left out. Writes merge by device and time, so a
// reading already stored is not stored twice.
func ReplayDay(ctx context.Context, js jetstream.JetStream, cfg Config, day buckets.Day, w Writer, tombs Tombstones) (int64, error) {
	cfg = cfg.withDefaults()
	st, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return 0, fmt.Errorf("replay %s: stream %s: %w", day, cfg.Stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("replay %s: stream %s: %w", day, cfg.Stream, err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return 0, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return 0, fmt.Errorf("replay %s: consumer: %w", day, err)
	}
	var batch []buckets.Reading
	var written int64
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := w.Write(ctx, batch); err != nil {
			return fmt.Errorf("replay %s: write: %w", day, err)
		}
		written += int64(len(batch))
		batch = batch[:0]
		return nil
	}
	for {
		msgs, err := cons.Fetch(256, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return written, fmt.Errorf("replay %s: fetch: %w", day, err)
		}
		n := 0
		for m := range msgs.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			rs := dayReadings(m, meta, cfg.deviceToken(m.Subject()), day, tombs)
			for len(rs) > 0 {
				k := min(len(rs), buckets.MaxBatch-len(batch))
				batch = append(batch, rs[:k]...)
				rs = rs[k:]
				if len(batch) == buckets.MaxBatch {
					if err := flush(); err != nil {
						return written, err
					}
				}
			}
			if meta.Sequence.Stream >= last {
				return written, flush()
			}
		}
		if err := msgs.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return written, fmt.Errorf("replay %s: fetch: %w", day, err)
		}
		if err := ctx.Err(); err != nil {
			return written, err
		}
		if n == 0 { // the messages up to last were removed meanwhile
			return written, flush()
		}
	}
}

// dayReadings decodes m, a message of device token, and returns its
// readings of day that tombs do not leave out. A line protocol write's
// message (package lpwire) holds several devices' readings.
func dayReadings(m jetstream.Msg, meta *jetstream.MsgMetadata, token string, day buckets.Day, tombs Tombstones) []buckets.Reading {
	if token == lpwire.Token && m.Headers().Get(lpwire.Header) == lpwire.Format {
		rs, _, err := lpwire.Decode(m.Data(), nil)
		if err != nil {
			return nil
		}
		return keepDay(rs, day, func(dev buckets.DeviceID) bool { return deletedAfter(tombs, dev, meta.Timestamp) })
	}
	dev, err := buckets.ParseDeviceID(token)
	if err != nil {
		return nil
	}
	if deletedAfter(tombs, dev, meta.Timestamp) {
		return nil
	}
	def, err := buckets.TicksOf(meta.Timestamp)
	if err != nil {
		return nil
	}
	var rs []buckets.Reading
	if h := m.Headers(); len(h) > 0 && h.Get(wire.Header) == wire.Format {
		rs, _, err = wire.Decode(dev, m.Data())
	} else {
		rs, _, err = Decode(dev, m.Data(), def)
	}
	if err != nil {
		return nil
	}
	return keepDay(rs, day, nil)
}

// deletedAfter reports whether tombs has dev deleted after a message
// stored at published.
func deletedAfter(tombs Tombstones, dev buckets.DeviceID, published time.Time) bool {
	if tombs == nil {
		return false
	}
	at, ok := tombs.DeletedAt(dev)
	return ok && published.Before(at)
}

// keepDay keeps the readings of rs of day whose device drop (if not
// nil) does not leave out.
func keepDay(rs []buckets.Reading, day buckets.Day, drop func(buckets.DeviceID) bool) []buckets.Reading {
	kept := rs[:0]
	for _, r := range rs {
		if r.Day() == day && (drop == nil || !drop(r.Device)) {
			kept = append(kept, r)
		}
	}
	return kept
}
