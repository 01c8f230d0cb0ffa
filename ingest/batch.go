package ingest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/buckets"
)

// batch gathers messages for one commit.
type batch struct {
	items    []item
	readings int
}

func (b *batch) reset() {
	clear(b.items)
	b.items, b.readings = b.items[:0], 0
}

// batchLoop gathers decoded messages into batches and commits them. A
// batch is committed when it holds MaxBatchReadings readings or its
// first message waited MaxBatchWait. It returns once intake has ended
// (intakeDone) and every message already received is settled. Writes
// run on a context that is not cancelled with ctx, so the batch in
// flight at shutdown is committed and acked.
func (in *Ingester) batchLoop(ctx context.Context, intakeDone <-chan struct{}) {
	wctx := context.WithoutCancel(ctx)
	var b batch
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	flush := func() {
		timer.Stop()
		if len(b.items) > 0 {
			in.settled.Add(int64(len(b.items)))
			in.commit(wctx, b.items, b.readings)
			in.release(b.readings)
			b.reset()
		}
	}
	add := func(it item) {
		if it.reject != nil {
			in.settled.Add(1)
			in.deadLetter(wctx, it, it.reject)
			return
		}
		if b.readings > 0 && b.readings+len(it.readings) > in.cfg.MaxBatchReadings {
			flush()
		}
		if len(b.items) == 0 {
			timer.Reset(in.cfg.MaxBatchWait)
		}
		b.items = append(b.items, it)
		b.readings += len(it.readings)
		if b.readings >= in.cfg.MaxBatchReadings {
			flush()
		}
	}
	for {
		select {
		case it := <-in.items:
			add(it)
		case <-timer.C:
			flush()
		case <-intakeDone:
			// Shutting down: from here on every ack waits for the
			// server's confirmation, so the batch in flight is acked
			// when Run returns.
			in.syncAcks = true
			for {
				select {
				case it := <-in.items:
					add(it)
				default:
					flush()
					return
				}
			}
		}
	}
}

// commit applies the attribute assignments of items with one Assign and
// writes their readings with one Write (see store) under an
// "ingest.batch" span linked to the publishers' spans, and acks the
// messages after both succeeded. When it fails, each message is
// written alone so that one poison message cannot hold back the others;
// those that still fail are nak'ed or dead-lettered.
func (in *Ingester) commit(ctx context.Context, items []item, n int) {
	var links []trace.Link
	for _, it := range items {
		if it.link.IsValid() {
			links = append(links, trace.Link{SpanContext: it.link})
		}
	}
	ctx, span := in.tracer.Start(ctx, "ingest.batch",
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.destination.name", in.cfg.Stream),
			attribute.Int("messaging.batch.message_count", len(items)),
			attribute.Int("telemetry.readings", n)))
	defer span.End()

	if in.cfg.Tombstones != nil {
		release := in.cfg.Tombstones.HoldDrops()
		defer release()
		if items, n = in.skipDropped(ctx, items, n); len(items) == 0 {
			return
		}
	}
	rs := items[0].readings
	if len(items) > 1 {
		rs = make([]buckets.Reading, 0, n)
		for _, it := range items {
			rs = append(rs, it.readings...)
		}
	}
	err := in.store(ctx, items, rs)
	if err == nil {
		in.committed(ctx, items, rs)
		return
	}
	span.RecordError(err)
	failed := 1
	if len(items) == 1 {
		in.writeFailed(ctx, items[0], err)
	} else {
		failed = in.writeOneByOne(ctx, items)
	}
	if failed > 0 {
		span.SetStatus(codes.Error, "write failed")
	}
	span.SetAttributes(attribute.Int("telemetry.failed_messages", failed))
	in.log.Warn("store write failed; failed messages are retried later",
		"messages", len(items), "failed", failed, "stream_seq", items[0].seq, "err", err)
}

// writeOneByOne writes each message of a failed batch alone and returns
// how many still failed.
func (in *Ingester) writeOneByOne(ctx context.Context, items []item) int {
	failed := 0
	for i, it := range items {
		if err := in.store(ctx, items[i:i+1], it.readings); err != nil {
			failed++
			in.writeFailed(ctx, it, err)
			continue
		}
		in.committed(ctx, items[i:i+1], it.readings)
	}
	return failed
}

// store commits what items carry: first their attribute assignments
// (one Assign), then their readings rs (one Write). Assignments go
// first so that a message the store refuses for its attributes (a
// device left with more than buckets.MaxAttributes) is rejected whole,
// its readings unwritten; when the write fails after the assignments
// were applied, the redelivery applies them again, which changes
// nothing.
func (in *Ingester) store(ctx context.Context, items []item, rs []buckets.Reading) error {
	if as := assignmentsOf(items); len(as) > 0 {
		if err := in.w.Assign(ctx, as); err != nil {
			return fmt.Errorf("assign attributes: %w", err)
		}
	}
	return in.w.Write(ctx, rs)
}

// committed records the metrics of readings rs, which were just
// written, then acks their messages. Metrics come first so that a
// reading is counted by the time its publisher can see it stored.
func (in *Ingester) committed(ctx context.Context, items []item, rs []buckets.Reading) {
	in.m.readings.Add(ctx, int64(len(rs)), in.m.accepted)
	in.m.batchSize.Record(ctx, int64(len(rs)))
	if now, err := buckets.TicksOf(in.now()); err == nil {
		in.m.recordLag(ctx, rs, now)
	}
	var ackErr error
	acked := 0
	for _, it := range items {
		if err := in.ack(ctx, it); err != nil {
			ackErr = err
			continue
		}
		acked++
	}
	if ackErr != nil {
		// The readings are stored; a redelivery rewrites the same keys.
		in.log.Warn("ack after commit failed; the messages will be redelivered and written again",
			"messages", len(items)-acked, "err", ackErr)
	}
	in.m.messages.Add(ctx, int64(acked), in.m.acked)
}

// ack acks a committed message: a plain ack normally, one confirmed by
// the server during shutdown.
func (in *Ingester) ack(ctx context.Context, it item) error {
	if in.syncAcks {
		ctx, cancel := context.WithTimeout(ctx, publishTimeout)
		err := it.msg.DoubleAck(ctx)
		cancel()
		if err == nil {
			return nil
		}
		// No confirmation (the connection is likely down): do not wait
		// for one per message; plain acks wait in the reconnect buffer.
		in.syncAcks = false
		in.log.Warn("confirmed ack failed; acking the rest without confirmation", "err", err)
	}
	return it.msg.Ack()
}

// writeFailed settles a message whose own write failed: a permanent
// error, or a failure of the write itself at the last allowed delivery,
// sends it to the dead letter subject; anything else is nak'ed with the
// back-off of its delivery. A failure of the store rather than of the
// message (storeDown) never dead-letters: the message waits in the
// stream, however many deliveries that takes, and is stored once the
// store writes again.
func (in *Ingester) writeFailed(ctx context.Context, it item, err error) {
	var ve *buckets.ValidationError
	switch {
	case errors.As(err, &ve):
		in.deadLetter(ctx, it, ve)
	case errors.Is(err, buckets.ErrInvalidReading):
		in.deadLetter(ctx, it, buckets.Invalid(buckets.CodeInvalidPayload, -1, "", "%v", err))
	case it.delivered >= uint64(in.cfg.MaxDeliver) && !storeDown(err):
		in.deadLetter(ctx, it, buckets.Invalid(buckets.CodeMaxDeliveries, -1, "",
			"not committed after %d deliveries; last store error: %v", it.delivered, err))
	default:
		in.nak(ctx, it)
	}
}

// storeDown reports whether err is a failure of the store rather than
// of the message written: the store refusing writes for now (a full
// disk, a damaged, dropping or closing table: buckets.ErrUnavailable),
// a call of the operating system that failed (its disk gone, its file
// system torn down under it), or the write's context ending.
func storeDown(err error) bool {
	var pathErr *fs.PathError
	var errno syscall.Errno
	return errors.Is(err, buckets.ErrUnavailable) || errors.As(err, &pathErr) || errors.As(err, &errno) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// nak asks for a redelivery after the back-off of the delivery count.
func (in *Ingester) nak(ctx context.Context, it item) {
	if err := it.msg.NakWithDelay(in.cfg.nakDelay(it.delivered)); err != nil {
		in.log.Warn("nak failed; the message is redelivered after the ack wait",
			"subject", it.msg.Subject(), "stream_seq", it.seq, "err", err)
	}
	in.m.messages.Add(ctx, 1, in.m.nak)
}
