package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
)

// Backpressure. The server delivers at most the consumer's
// MaxAckPending messages that are not yet acked; the client pulls at
// most PullMaxBytes of them ahead of the handler, and the handler waits
// while the decoded readings not yet committed exceed twice
// MaxBatchReadings. Those bound memory. On top of that the ingester
// keeps the number of messages it holds near what it commits in
// paceWindow (Little's law: outstanding = rate x wait): every
// PaceEvery it measures the messages settled per second and sets the
// consumer's MaxAckPending to paceWindow of them, between
// minAckPending and the configured MaxAckPending. When commits fall
// behind (a slow disk, compactions, a backlog of millions of readings
// after an outage) fewer messages are delivered and pulls come back
// smaller, so nothing waits in memory long enough to reach its ack
// wait; the backlog stays on disk in JetStream. When commits speed up,
// the window grows with them. A consumer starts with the smallest
// window (slow start), so the first second after an outage does not
// pull the configured maximum at once.
const (
	// paceWindow is how much commit time the ingester holds in
	// delivered, unacked messages.
	paceWindow = 2 * time.Second
	// minAckPending is the smallest window: a few batches of messages
	// of 100 readings, and what arrived during a short pause fits one
	// pull.
	minAckPending = 256
	// paceChange is the least relative change worth a consumer update.
	paceChange = 0.25
)

// pace adjusts the consumer's MaxAckPending every PaceEvery until ctx
// is done.
func (in *Ingester) pace(ctx context.Context) {
	t := time.NewTicker(in.cfg.PaceEvery)
	defer t.Stop()
	last := time.Now()
	rate := -1.0 // messages settled per second, smoothed; -1 until measured
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			n := in.settled.Swap(0)
			r := float64(n) / now.Sub(last).Seconds()
			last = now
			if rate < 0 {
				rate = r
			} else {
				rate = (rate + r) / 2
			}
			in.setAckWindow(ctx, ackWindow(rate, in.cfg.MaxAckPending))
		}
	}
}

// ackWindow is the MaxAckPending for a commit rate of rate messages per
// second, at most limit.
func ackWindow(rate float64, limit int) int {
	w := int(rate * paceWindow.Seconds())
	return max(min(w, limit), min(minAckPending, limit))
}

// setAckWindow updates the consumer's MaxAckPending to want when it
// differs enough from the current value.
func (in *Ingester) setAckWindow(ctx context.Context, want int) {
	in.mu.Lock()
	cons := in.cons
	in.mu.Unlock()
	if cons == nil {
		return
	}
	cfg := cons.CachedInfo().Config
	cur := cfg.MaxAckPending
	if !repace(cur, want, in.cfg.MaxAckPending, in.replicated(cfg)) {
		return
	}
	cfg.MaxAckPending = want
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	c, err := in.js.UpdateConsumer(ctx, in.cfg.Stream, cfg)
	if err != nil {
		in.log.Debug("update the consumer's ack window", "max_ack_pending", want, "err", err)
		return
	}
	in.mu.Lock()
	if in.cons == cons { // not set up again meanwhile
		in.cons = c
	}
	in.mu.Unlock()
	in.window.Store(int64(want))
	if want < in.cfg.MaxAckPending {
		in.log.Debug("ingest paced to the commit rate", "max_ack_pending", want, "was", cur)
	} else {
		in.log.Debug("ingest window back to its maximum", "max_ack_pending", want)
	}
}

// repace reports whether a consumer's window cur should become want
// (at most limit): a change of at least paceChange, or back to the
// limit, and never down for a replicated consumer.
func repace(cur, want, limit int, replicated bool) bool {
	switch {
	case cur == want, replicated && want < cur:
		return false
	case want == limit:
		return true
	}
	return abs(want-cur) >= int(paceChange*float64(cur))
}

// replicated reports whether the consumer of cfg keeps more than one
// replica: its own count, or else its stream's.
func (in *Ingester) replicated(cfg jetstream.ConsumerConfig) bool {
	if cfg.Replicas > 0 {
		return cfg.Replicas > 1
	}
	in.mu.Lock()
	st := in.stream
	in.mu.Unlock()
	return st != nil && st.CachedInfo().Config.Replicas > 1
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// observeWindow registers the gauge telemetry.ingest.ack_window: the
// consumer's current MaxAckPending.
func (in *Ingester) observeWindow(mp metric.MeterProvider) error {
	_, err := mp.Meter(instrumentationName).Int64ObservableGauge("telemetry.ingest.ack_window",
		metric.WithDescription("Messages the consumer may hold delivered and unacked (MaxAckPending), paced to the commit rate."),
		metric.WithUnit("{message}"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(in.window.Load())
			return nil
		}))
	if err != nil {
		return fmt.Errorf("ack window gauge: %w", err)
	}
	return nil
}
