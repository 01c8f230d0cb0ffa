package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// maxPending bounds the publishes awaiting their JetStream ack.
	maxPending = 4096
	// pubAckTimeout is how long one publish may wait for its ack.
	pubAckTimeout = time.Minute
)

// pubStats is the outcome of publishing a workload.
type pubStats struct {
	msgs    int           // messages acked by JetStream
	elapsed time.Duration // first publish to last ack
}

// publishAll publishes messages [0, w.msgs) of w with async JetStream
// publishes, at most maxPending unacked, and waits for every ack. With
// rate > 0 it publishes at most rate readings per second. When
// ctx is cancelled it stops publishing, waits for the acks of what it
// sent and returns them with ctx's error. A publish that fails is an
// error: the benchmark counts only readings that were accepted.
func publishAll(ctx context.Context, nc *nats.Conn, w workload, rate float64) (pubStats, error) {
	var acked, failed atomic.Int64
	var firstErr atomic.Pointer[error]
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(maxPending),
		jetstream.WithPublishAsyncTimeout(pubAckTimeout),
		jetstream.WithPublishAsyncAckHandler(func(jetstream.JetStream, *nats.Msg, *jetstream.PubAck) {
			acked.Add(1)
		}),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, &err)
		}))
	if err != nil {
		return pubStats{}, fmt.Errorf("jetstream: %w", err)
	}
	size := len(w.payload(nil, 0)) + 16
	start := time.Now()
	var stopped error
	for m := 0; m < w.msgs; m++ {
		if err := pace(ctx, start, m*w.perMsg, rate); err != nil {
			stopped = err
			break
		}
		msg := &nats.Msg{Subject: w.subject(m), Data: w.payload(make([]byte, 0, size), m)}
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

// pace waits until reading n is due at rate readings per second after
// start (at once when rate is 0), or ctx is done (its error).
func pace(ctx context.Context, start time.Time, n int, rate float64) error {
	if rate <= 0 {
		return ctx.Err()
	}
	d := time.Until(start.Add(time.Duration(float64(n) / rate * float64(time.Second))))
	if d <= 0 {
		return ctx.Err()
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
