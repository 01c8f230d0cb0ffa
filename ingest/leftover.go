package ingest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Leftover readings streams. A single node keeps its readings in one
// stream per partition (TELEMETRY_0 .. TELEMETRY_<N-1>). A stream of the
// family that the layout no longer has, the one stream TELEMETRY of
// earlier versions or the partitions past a lowered partition count,
// receives nothing new (the server maps every
// publish to a partition's stream), but may hold messages not yet
// stored. Each is drained at start: an ingester of its own consumes it
// as before (its own consumer, positions and dead letters) while the
// partition streams take the new publishes, and once every message it
// held is settled (stored or dead-lettered, and acked) the stream is
// deleted. The store merges readings by device and time, so a reading
// that is in both (a publish retried across the upgrade) is stored
// once.

// drainEvery is how often a leftover stream's backlog is looked at.
const drainEvery = time.Second

// LeftoverStreams names the readings streams of icfg's family that its
// layout does not have, each with the configuration to drain it
// (DrainLeftover).
func LeftoverStreams(ctx context.Context, js jetstream.JetStream, icfg Config) ([]Config, error) {
	if !icfg.PartitionStreams {
		return nil, nil
	}
	family := icfg.Family()
	var out []Config
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		c := icfg
		rest, ok := strings.CutPrefix(name, family+"_")
		p, err := strconv.Atoi(rest)
		switch {
		case name == family:
			c.Stream, c.PartitionStreams, c.Partitions, c.Partition, c.Intake = family, false, 0, 0, false
		case ok && err == nil && strconv.Itoa(p) == rest && p >= icfg.Partitions:
			c.Partitions = p + 1
			c = c.ForPartition(p)
		default:
			continue
		}
		out = append(out, c)
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	// Draining must not shrink a stream's limits (which would remove
	// messages not yet stored): each keeps its own where larger.
	for i, c := range out {
		st, err := js.Stream(ctx, c.Stream)
		if err != nil {
			return nil, fmt.Errorf("look up stream %s: %w", c.Stream, err)
		}
		have := st.CachedInfo().Config
		out[i].StreamMaxBytes = max(c.StreamMaxBytes, have.MaxBytes)
		out[i].StreamMaxAge = max(c.StreamMaxAge, have.MaxAge)
	}
	return out, nil
}

// DrainLeftover consumes one leftover stream (c, from LeftoverStreams)
// from nc into w until every message it held is settled, then deletes
// it. It returns when done or when ctx ends (the stream then stays for
// the next start). It logs what it did and why it stopped.
func DrainLeftover(ctx context.Context, nc *nats.Conn, w Writer, c Config) {
	c = c.withDefaults()
	log := c.Logger.With("stream", c.Stream)
	log.Info("draining a readings stream of an earlier layout into the store; it is deleted once settled")
	c.Logger = log
	js, err := jetstream.New(nc)
	if err != nil {
		log.Error("cannot drain the stream of an earlier layout", "err", err)
		return
	}
	ing, err := New(nc, w, c)
	if err != nil {
		log.Error("cannot drain the stream of an earlier layout", "err", err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- ing.Run(runCtx) }()
	t := time.NewTicker(drainEvery)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				log.Error("draining the stream of an earlier layout stopped", "err", err)
			}
			return
		case <-t.C:
		}
		pending, _, err := ing.Backlog(ctx)
		if err != nil || pending > 0 {
			continue
		}
		stop()
		if err := <-done; err != nil {
			log.Error("draining the stream of an earlier layout stopped", "err", err)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if err := deleteIfSettled(ctx, js, c); err != nil {
			log.Warn("the stream of an earlier layout stays; drained again at the next start", "err", err)
			return
		}
		log.Info("the stream of an earlier layout is drained into the store and deleted")
		return
	}
}

// errNotSettled: a leftover stream still holds a message its consumer
// has not settled.
var errNotSettled = errors.New("it holds messages not yet settled")

// deleteIfSettled deletes c's stream once its consumer's ack floor has
// reached the stream's last message and nothing is pending.
func deleteIfSettled(ctx context.Context, js jetstream.JetStream, c Config) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, c.Stream)
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", c.Stream, err)
	}
	cons, err := js.Consumer(ctx, c.Stream, c.Consumer)
	if err != nil {
		return fmt.Errorf("look up consumer %s: %w", c.Consumer, err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("consumer %s: %w", c.Consumer, err)
	}
	last := st.CachedInfo().State.LastSeq
	if ci.NumPending > 0 || ci.NumAckPending > 0 || ci.AckFloor.Stream < last {
		return fmt.Errorf("stream %s: %w (ack floor %d, last message %d)", c.Stream, errNotSettled, ci.AckFloor.Stream, last)
	}
	if err := js.DeleteStream(ctx, c.Stream); err != nil {
		return fmt.Errorf("delete stream %s: %w", c.Stream, err)
	}
	return nil
}
