package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest/partition"
)

// What the streams guarantee. An acked publish is stored (or
// dead-lettered with a reason) whatever any other client does:
//
//   - No duplicate window on Stream. JetStream deduplicates by
//     Nats-Msg-Id alone, per stream, so with a window one device could
//     suppress another's message by publishing its ID first (line
//     protocol IDs are computable, the MQTT listener numbers its QoS 2
//     deliveries from 1, firmware numbers its messages 1, 2, 3). The
//     server replaces a zero window by 2 minutes unless the stream has
//     sources, and only there keeps zero, which it treats as off. So
//     Stream sources one stream, <Stream>_NODEDUP: empty, bounded to one
//     tiny message, on a subject devices may not publish to (anything
//     that does arrive is dead-lettered as invalid_device). EnsureStream
//     checks the effective window and refuses to run with any other.
//     Retries stay idempotent without the window: the store merges
//     readings with the same device and time, and a reading without a
//     time takes its message's stored time, so only such a reading sent
//     twice is stored twice.
//   - Discard new on Stream: a full stream refuses a publish (the client
//     sees an error and retries) instead of removing the oldest message,
//     which may be another device's acked and not yet stored reading.
//     Consumed messages must not keep it full, so the ingester removes
//     the oldest settled ones (trimSettled) once it passes trimHighPct of
//     MaxBytes. Below that they stay, as the replay buffer.
//   - The rejected stream discards old: a dead letter is never refused
//     (so the ingester is never blocked by a full rejected stream), and
//     a device keeps at most RejectedMaxPerDevice dead letters, so a
//     flood of one device's rejects removes its own oldest first.

// trimHighPct and trimLowPct (of MaxBytes): past the high mark the
// oldest settled messages of Stream are purged down to the low one.
const (
	trimHighPct = 80
	trimLowPct  = 60
	// staleConsumerAfter: a consumer sharing the ingester's filter
	// (another node's copy of a partition) that has delivered nothing
	// for this long is taken to be gone and no longer holds the trim back.
	staleConsumerAfter = 10 * time.Minute
)

// noDedupStream is the empty stream that Stream sources so that the
// server keeps Stream's duplicate window at zero.
func noDedupStream(stream string) string { return stream + "_NODEDUP" }

// noDedupSubject is noDedupStream's subject; no device may publish on it.
func noDedupSubject(stream string) string { return "$TELEMETRYD.nodedup." + stream }

// errDuplicateWindow refuses a stream whose server kept a duplicate
// window.
var errDuplicateWindow = errors.New("the server keeps a duplicate window on the stream, so one device could suppress another's messages by their Nats-Msg-Id")

// streamConfig is the configuration of the readings stream that
// EnsureStream creates (an existing stream keeps its other settings).
func streamConfig(c Config) jetstream.StreamConfig {
	c = c.withDefaults()
	subjects := c.Subjects().All()
	if c.PartitionStreams {
		subjects = partition.Subjects(c.SubjectPrefix, c.Partition)
	}
	sc := c.partitioned(jetstream.StreamConfig{
		Name:        c.Stream,
		Description: "Device readings published on " + subjects,
		Subjects:    []string{subjects},
		Storage:     jetstream.FileStorage,
		MaxAge:      c.StreamMaxAge,
		MaxBytes:    c.StreamMaxBytes,
		Discard:     jetstream.DiscardNew,
		Duplicates:  0, // off: kept so by the source (see above)
		Sources:     []*jetstream.StreamSource{{Name: noDedupStream(c.Family())}},
		// Atomic batches: see Config.AtomicPublish.
		AllowAtomicPublish: c.AtomicPublish,
	})
	if c.MQTTCopies { // with partitions only with PartitionStreams (validatePartitions)
		t := c.Subjects().MQTTCopiesTransform()
		if c.PartitionStreams {
			t = c.Subjects().MQTTCopiesOfTransform(strconv.Itoa(c.Partition))
		}
		sc.Subjects = append(sc.Subjects, t.Source)
		sc.SubjectTransform = &t
	}
	if c.Intake { // with PartitionStreams only (validatePartitions)
		copies := sc.Subjects[1:]
		sc = c.intakeStreamConfig(sc)
		sc.Subjects = append(sc.Subjects, copies...)
	}
	return sc
}

// EnsureStream creates or updates the readings stream of c (and the
// empty stream it sources), then checks that its duplicate window is
// off. The service calls it before anything captures the MQTT
// listener's copies; the Ingester calls it at every set-up.
func EnsureStream(ctx context.Context, js jetstream.JetStream, c Config, log *slog.Logger) (jetstream.Stream, error) {
	c = c.withDefaults()
	if log == nil {
		log = c.Logger
	}
	if _, err := ensureStream(ctx, js, log, jetstream.StreamConfig{
		Name:        noDedupStream(c.Family()),
		Description: "Empty on purpose: " + c.Family() + " (each partition's stream) sources it, so the server keeps its duplicate window off",
		Subjects:    []string{noDedupSubject(c.Family())},
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
		MaxMsgs:     1,
		MaxBytes:    1 << 10,
		MaxMsgSize:  1,
		Discard:     jetstream.DiscardNew,
	}); err != nil {
		return nil, err
	}
	st, err := ensureStream(ctx, js, log, streamConfig(c))
	if err != nil {
		return nil, err
	}
	if c.Intake {
		if st, err = toIntake(ctx, js, st, c, log); err != nil {
			return nil, err
		}
	}
	if d := st.CachedInfo().Config.Duplicates; d != 0 {
		return nil, fmt.Errorf("%w: stream %s: duplicate window %s: %w", errPermanent, c.Stream, d, errDuplicateWindow)
	}
	return st, nil
}

// CaptureMQTTCopies makes the readings stream of c (c.MQTTCopies set)
// capture the embedded MQTT listener's store copies and keep each as
// <prefix>.<device>, as streamConfig says. A missing stream is created
// first (EnsureStream). The stream's subscription to the copies is made
// anew, because the server lets an account import (the MQTT account's
// copies, see package natsembed) reach only subscriptions made after it:
// the embedded server calls this once the import exists.
//
// With PartitionStreams every partition's stream captures its own
// partition's copies.
func CaptureMQTTCopies(ctx context.Context, js jetstream.JetStream, c Config, log *slog.Logger) error {
	if !c.MQTTCopies {
		return errors.New("capture MQTT copies: the configuration does not capture them")
	}
	if !c.PartitionStreams {
		return captureMQTTCopies(ctx, js, c.withDefaults(), log)
	}
	for p := range c.Partitions {
		if err := captureMQTTCopies(ctx, js, c.ForPartition(p), log); err != nil {
			return err
		}
	}
	return nil
}

// captureMQTTCopies is CaptureMQTTCopies of one stream.
func captureMQTTCopies(ctx context.Context, js jetstream.JetStream, c Config, log *slog.Logger) error {
	want := streamConfig(c)
	copies := c.Subjects().MQTTCopiesTransform().Source
	if c.PartitionStreams {
		copies = c.Subjects().MQTTCopiesOfTransform(strconv.Itoa(c.Partition)).Source
	}
	st, err := EnsureStream(ctx, js, c, log)
	if err != nil {
		return err
	}
	cfg := st.CachedInfo().Config
	if slices.Contains(cfg.Subjects, copies) {
		cfg.Subjects = slices.DeleteFunc(cfg.Subjects, func(s string) bool { return s == copies })
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("stream %s without %s: %w", c.Stream, copies, err)
		}
	}
	cfg.Subjects = append(cfg.Subjects, copies)
	cfg.SubjectTransform = want.SubjectTransform
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("stream %s with %s: %w", c.Stream, copies, err)
	}
	return nil
}

// rejectedStreamConfig is the dead-letter stream's configuration.
func (in *Ingester) rejectedStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              in.cfg.RejectedStream,
		Description:       "Dead letters: messages of " + in.cfg.Subjects().All() + " that were not stored, with the reason",
		Subjects:          []string{in.cfg.Subjects().RejectedAll()},
		Storage:           jetstream.FileStorage,
		MaxAge:            RejectedMaxAge,
		MaxBytes:          in.cfg.RejectedMaxBytes,
		MaxMsgsPerSubject: in.cfg.RejectedMaxPerDevice,
		Discard:           jetstream.DiscardOld,
		Replicas:          in.cfg.Replicas,
	}
}

// trimLoop runs trimSettled every PaceEvery until ctx is done.
func (in *Ingester) trimLoop(ctx context.Context) {
	every(ctx, in.cfg.PaceEvery, func() {
		// A stream deleted (an earlier layout's, once drained) is not
		// this loop's to report.
		if err := in.trimSettled(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			in.log.Warn("trim settled messages from the stream", "stream", in.cfg.Stream, "err", err)
		}
	})
}

// trimSettled purges the oldest messages of Stream that every live
// consumer reading what this ingester reads has settled, once the
// stream holds more than trimHighPct of its MaxBytes, down to about
// trimLowPct. It never purges above the settled floor, so a full stream
// of unsettled messages stays full (and refuses publishes) until they
// are settled.
func (in *Ingester) trimSettled(ctx context.Context) error {
	in.mu.Lock()
	st, cons := in.stream, in.cons
	in.mu.Unlock()
	if st == nil || cons == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream info: %w", err)
	}
	limit, state := info.Config.MaxBytes, info.State
	if limit <= 0 || state.Msgs == 0 || state.Bytes*100 < uint64(limit)*trimHighPct {
		return nil
	}
	floor, err := in.settledFloor(ctx, st, cons)
	if err != nil {
		return err
	}
	// From the oldest message this ingester reads, purge about the
	// excess of sequences (at the stream's mean size). With a partition
	// filter only its messages within them go, about 1/Partitions of the
	// excess: each partition's ingester frees its share, and the next
	// tick goes on from where this one stopped.
	first := state.FirstSeq
	opts := []jetstream.StreamPurgeOpt{}
	if f := cons.CachedInfo().Config.FilterSubjects; len(f) == 1 {
		m, err := st.GetMsg(ctx, state.FirstSeq, jetstream.WithGetMsgSubject(f[0]))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil // nothing of ours to purge
		}
		if err != nil {
			return fmt.Errorf("first message of %s: %w", f[0], err)
		}
		first = m.Sequence
		opts = append(opts, jetstream.WithPurgeSubject(f[0]))
	}
	perMsg := max(state.Bytes/state.Msgs, 1)
	excess := state.Bytes - uint64(limit)*trimLowPct/100
	cut := min(first+excess/perMsg+1, floor+1) // purge below cut
	if cut <= first {
		return nil
	}
	opts = append(opts, jetstream.WithPurgeSequence(cut))
	if err := st.Purge(ctx, opts...); err != nil {
		return fmt.Errorf("purge below %d: %w", cut, err)
	}
	in.log.Debug("trimmed settled messages", "stream", in.cfg.Stream, "below_seq", cut, "bytes_before", state.Bytes)
	return nil
}

// settledFloor is the lowest ack floor among the consumers of st that
// read what cons reads (the same filter: this ingester's, and other
// nodes' copies of its partition) and delivered something within
// staleConsumerAfter; cons itself always counts.
func (in *Ingester) settledFloor(ctx context.Context, st jetstream.Stream, cons jetstream.Consumer) (uint64, error) {
	own, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("consumer info: %w", err)
	}
	floor := own.AckFloor.Stream
	lister := st.ListConsumers(ctx)
	for ci := range lister.Info() {
		if ci.Name == own.Name || !slices.Equal(ci.Config.FilterSubjects, own.Config.FilterSubjects) ||
			ci.Config.FilterSubject != own.Config.FilterSubject {
			continue
		}
		if last := ci.Delivered.Last; last == nil || time.Since(*last) > staleConsumerAfter {
			continue
		}
		floor = min(floor, ci.AckFloor.Stream)
	}
	if err := lister.Err(); err != nil {
		return 0, fmt.Errorf("list consumers: %w", err)
	}
	return floor, nil
}
