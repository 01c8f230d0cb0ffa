package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/semaphore"
)

const (
	// maxPending bounds the publishes awaiting their JetStream ack.
	maxPending = 4096
	// maxPendingBytes bounds their payload bytes: half the NATS
	// server's default stream ingest queue (128 MiB), past which the
	// server answers 429 Too Many Requests instead of storing (4,096
	// TSBS messages of 100 readings are 280 MB).
	maxPendingBytes = 64 << 20
	// pubAckTimeout is how long one publish may wait for its ack.
	pubAckTimeout = time.Minute
)

// pubStats is the outcome of publishing a workload.
type pubStats struct {
	msgs    int           // messages acked by JetStream
	elapsed time.Duration // first publish to last ack
}

// messages is what publishAll publishes: the bench's generated
// workload, or a TSBS file's readings (tsbsMessages).
type messages interface {
	// count is the number of messages.
	count() int
	// readingsBefore is the number of readings in messages [0, m).
	readingsBefore(m int) int
	// natsMsg is message m, ready to publish.
	natsMsg(m int) *nats.Msg
}

// publishAll publishes messages [0, w.count()) of w with async JetStream
// publishes, at most maxPending and maxPendingBytes unacked, and waits
// for every ack. When
// hold is set it is called before each message with the readings sent
// so far and may wait (pacing, a bound on the backlog). When
// ctx is cancelled it stops publishing, waits for the acks of what it
// sent and returns them with ctx's error. A publish that fails is an
// error: the benchmark counts only readings that were accepted.
func publishAll(ctx context.Context, nc *nats.Conn, w messages, hold func(ctx context.Context, sent int) error) (pubStats, error) {
	var acked, failed atomic.Int64
	var firstErr atomic.Pointer[error]
	window := semaphore.NewWeighted(maxPendingBytes)
	weight := func(m *nats.Msg) int64 { return min(int64(len(m.Data)), maxPendingBytes) }
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(maxPending),
		jetstream.WithPublishAsyncTimeout(pubAckTimeout),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) {
			window.Release(weight(m))
			acked.Add(1)
		}),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			window.Release(weight(m))
			failed.Add(1)
			firstErr.CompareAndSwap(nil, &err)
		}))
	if err != nil {
		return pubStats{}, fmt.Errorf("jetstream: %w", err)
	}
	start := time.Now()
	var stopped error
	for m := range w.count() {
		if err := ctx.Err(); err != nil {
			stopped = err
			break
		}
		if hold != nil {
			if err := hold(ctx, w.readingsBefore(m)); err != nil {
				stopped = err
				break
			}
		}
		msg := w.natsMsg(m)
		if err := window.Acquire(ctx, weight(msg)); err != nil {
			stopped = err
			break
		}
		if _, err := js.PublishMsgAsync(msg, jetstream.WithStallWait(pubAckTimeout)); err != nil {
			return pubStats{}, fmt.Errorf("publish message %d: %w", m, err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * pubAckTimeout):
		return pubStats{}, fmt.Errorf("%d publishes still unacked after %s", js.PublishAsyncPending(), 2*pubAckTimeout)
	}
	st := pubStats{msgs: int(acked.Load()), elapsed: time.Since(start)}
	if n := failed.Load(); n > 0 {
		return st, fmt.Errorf("%d publishes failed, the first with: %w", n, *firstErr.Load())
	}
	return st, stopped
}

// isStopped reports whether err only says that a publisher was told to
// stop.
func isStopped(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// pacer returns a hold for publishAll that sends at most rate readings
// per second, counted from its first call.
func pacer(rate float64) func(ctx context.Context, sent int) error {
	var start time.Time
	return func(ctx context.Context, sent int) error {
		if start.IsZero() {
			start = time.Now()
		}
		d := time.Until(start.Add(time.Duration(float64(sent) / rate * float64(time.Second))))
		if d <= 0 {
			return nil
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
}
