package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/wire"
	"github.com/telemetryd/telemetryd/ingest/lpwire"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

const (
	// setupTimeout bounds one attempt to create the streams and consumer.
	setupTimeout = 10 * time.Second
	// retryMin and retryMax bound the back-off between set-up attempts.
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
	// pullExpiry is how long one pull request waits; the server sends
	// idle heartbeats every half of it, so a dead consumer is noticed
	// within about pullExpiry.
	pullExpiry = 10 * time.Second
	// stopTimeout bounds the wait for a stopped consume to finish its
	// last callback.
	stopTimeout = 5 * time.Second
)

// item is one delivered message, decoded and validated.
type item struct {
	msg       jetstream.Msg
	seq       uint64    // stream sequence
	published time.Time // when the stream stored it
	delivered uint64    // delivery count, 1 on first delivery
	readings  []buckets.Reading
	assigns   []buckets.Assignment     // attribute assignments the message carries
	reject    *buckets.ValidationError // why the message cannot be stored
	link      trace.SpanContext        // the publisher's span, if any
}

// setup creates or updates the streams and the durable consumer.
func (in *Ingester) setup(ctx context.Context) (jetstream.Consumer, error) {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	st, err := in.readingsStream(ctx)
	if err != nil {
		return nil, err
	}
	if err := in.checkPartitions(st.CachedInfo().Config); err != nil {
		return nil, err
	}
	if _, err := ensureStream(ctx, in.js, in.log, in.rejectedStreamConfig()); err != nil {
		return nil, err
	}
	ccfg := jetstream.ConsumerConfig{
		Durable:     in.cfg.Consumer,
		Description: "Commits readings to storage",
		AckPolicy:   jetstream.AckExplicitPolicy,
		AckWait:     in.cfg.AckWait,
		// Unbounded on the server: a delivery that is never settled (a
		// restart, a power cut, a write that outlived its ack wait) is
		// not the message's fault, and a message the server stops
		// delivering would be skipped. The ingester bounds the failures
		// of a message's own write (writeFailed).
		MaxDeliver:    -1,
		BackOff:       in.cfg.serverBackOff(),
		MaxAckPending: int(in.window.Load()), // paced from here on (backpressure.go)
		// No filter: see "The consumer has no filter" below.
	}
	in.partitionFilter(&ccfg)
	if err := in.startPosition(ctx, st, &ccfg); err != nil {
		return nil, err
	}
	cons, err := in.js.CreateOrUpdateConsumer(ctx, in.cfg.Stream, ccfg)
	if err != nil {
		return nil, fmt.Errorf("create or update consumer %s: %w", in.cfg.Consumer, err)
	}
	// A consumer the lookup in startPosition did not find (a server
	// back from an outage that did not know it yet) is updated here, not
	// created, and keeps its ack floor: one that has delivered before is
	// checked against the store again, or an emptied store would resume
	// past everything the consumer acked.
	if cons.CachedInfo().Delivered.Consumer > 0 && in.storeBehind(ctx, st, cons) {
		if err := in.js.DeleteConsumer(ctx, in.cfg.Stream, in.cfg.Consumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("delete consumer %s, which acked past the store: %w", in.cfg.Consumer, err)
		}
		return nil, fmt.Errorf("consumer %s existed after all, acked past the store; deleted, to be created again", in.cfg.Consumer)
	}
	cons = in.resetPending(ctx, cons)
	in.mu.Lock()
	in.stream = st
	in.cons = cons
	in.window.Store(int64(cons.CachedInfo().Config.MaxAckPending))
	in.startSeq = st.CachedInfo().State.LastSeq
	// Dead letter IDs name the stream incarnation, so a stream that was
	// deleted and created again never reuses the ID of an older message.
	in.dedupPrefix = in.cfg.Stream + "." + strconv.FormatInt(st.CachedInfo().Created.UnixNano(), 36) + "."
	in.mu.Unlock()
	return cons, nil
}

// ensureStream creates the stream from want when it is missing. An
// existing stream keeps the settings an operator gave it (replicas,
// placement, other limits); only what the ingester relies on is
// updated: its subjects and sources are added, and MaxAge, MaxBytes,
// the discard policy, MaxMsgsPerSubject (when want sets one) and the
// duplicate window (when want has sources) set.
func ensureStream(ctx context.Context, js jetstream.JetStream, log *slog.Logger,
	want jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = js.CreateStream(ctx, want)
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // else created meanwhile
			return st, wrapStreamErr(want.Name, "create", err)
		}
		st, err = js.Stream(ctx, want.Name)
	}
	if err != nil {
		return nil, wrapStreamErr(want.Name, "look up", err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Storage != want.Storage {
		log.Warn("stream does not use file storage; keeping it", "stream", want.Name, "storage", cfg.Storage.String())
	}
	// A zero MaxMsgsPerSubject is "unset" (the server stores -1): an
	// operator's value is then kept.
	perSubject := want.MaxMsgsPerSubject > 0 && cfg.MaxMsgsPerSubject != want.MaxMsgsPerSubject
	changed := cfg.MaxAge != want.MaxAge || cfg.MaxBytes != want.MaxBytes || cfg.Discard != want.Discard || perSubject
	// The server fills in a zero duplicate window (2 minutes) unless the
	// stream has sources: only there does it mean "off" (nodedup.go).
	if len(want.Sources) > 0 && cfg.Duplicates != want.Duplicates {
		changed = true
	}
	if want.AllowAtomicPublish && !cfg.AllowAtomicPublish {
		cfg.AllowAtomicPublish = true
		changed = true
	}
	for _, subj := range want.Subjects {
		if !slices.Contains(cfg.Subjects, subj) {
			cfg.Subjects = append(cfg.Subjects, subj)
			changed = true
		}
	}
	for _, src := range want.Sources {
		if !slices.ContainsFunc(cfg.Sources, func(s *jetstream.StreamSource) bool { return s.Name == src.Name }) {
			cfg.Sources = append(cfg.Sources, src)
			changed = true
		}
	}
	if !changed {
		return st, nil
	}
	cfg.MaxAge, cfg.MaxBytes, cfg.Discard = want.MaxAge, want.MaxBytes, want.Discard
	if perSubject {
		cfg.MaxMsgsPerSubject = want.MaxMsgsPerSubject
	}
	if len(want.Sources) > 0 {
		cfg.Duplicates = want.Duplicates
	}
	st, err = js.UpdateStream(ctx, cfg)
	return st, wrapStreamErr(want.Name, "update", err)
}

// The consumer has no filter (partitioned.go gives it its partition's):
// it reads every subject the stream captures. nats-server serves a
// consumer whose filters differ from the stream's subjects by matching
// each stored message against them (msgBlock.firstMatching), which cost
// 40% of the service's CPU at one reading per message; an unfiltered
// consumer takes the sequence in order. Every message the stream keeps
// is therefore delivered and settled by subject (handler):
//
//   - <prefix>.<device>: decoded, then stored or dead-lettered;
//   - anything else (a subject an operator added to the stream, or a
//     device token that is a literal wildcard: the stream's "<prefix>.*"
//     stores "<prefix>.>"): dead-lettered with invalid_device, so
//     nothing sits unread in the stream.

// logConsuming says the consumer is consuming: at INFO once per
// service, with a stream per partition by partition 0's ingester for
// the family (the others at DEBUG).
// With a stream per partition the service's logger of each ingester
// carries its stream already.
func (in *Ingester) logConsuming() {
	if !in.cfg.PartitionStreams {
		in.log.Info("consuming", "stream", in.cfg.Stream, "consumer", in.cfg.Consumer)
		return
	}
	if in.cfg.Partition != 0 {
		in.log.Debug("consuming", "consumer", in.cfg.Consumer)
		return
	}
	in.log.Info("consuming", "consumer", in.cfg.Consumer, "streams", in.cfg.Partitions, "family", in.cfg.Family())
}

func wrapStreamErr(name, op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s stream %s: %w", op, name, err)
}

// readingsStream creates or updates the readings stream, or with
// Config.Existing only looks it up: a missing one is then refused.
func (in *Ingester) readingsStream(ctx context.Context) (jetstream.Stream, error) {
	if !in.cfg.Existing {
		return EnsureStream(ctx, in.js, in.cfg, in.log)
	}
	st, err := in.js.Stream(ctx, in.cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: stream %s: %w", errPermanent, in.cfg.Stream, err)
	}
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", in.cfg.Stream, err)
	}
	return st, nil
}

// setupUntilDone retries setup until it succeeds, ctx is done (nil, nil)
// or the server refuses the configuration (the error).
func (in *Ingester) setupUntilDone(ctx context.Context) (jetstream.Consumer, error) {
	delay := retryMin
	for {
		cons, err := in.setup(ctx)
		switch {
		case err == nil:
			return cons, nil
		case ctx.Err() != nil:
			return nil, nil
		case refused(err):
			return nil, fmt.Errorf("ingest: %w", err)
		}
		in.setState(fmt.Errorf("ingest: set up streams and consumer: %w", err))
		in.log.Warn("set up streams and consumer failed; retrying", "err", err, "retry_in", delay)
		if !sleep(ctx, delay) {
			return nil, nil
		}
		delay = min(2*delay, retryMax)
	}
}

// refused reports whether the JetStream API rejected a request for a
// reason that retrying cannot fix (a 4xx answer).
func refused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, errPermanent) || errors.As(err, &apiErr) && apiErr.Code >= 400 && apiErr.Code < 500
}

// errPermanent marks a set-up error that retrying cannot fix.
var errPermanent = errors.New("refused")

// consume runs the continuous pull until ctx is done. When consuming
// breaks (consumer deleted, server lost its state, connection closed)
// it sets the streams and consumer up again, with back-off, and
// resumes. It returns once ctx is done and the last callback finished.
func (in *Ingester) consume(ctx context.Context, cons jetstream.Consumer) {
	handle := in.handler(ctx)
	delay := retryMin
	for {
		select { // forget signals about a previous consume
		case <-in.broken:
		default:
		}
		if !in.waitHold(ctx) {
			return
		}
		started := time.Now()
		cc, err := cons.Consume(handle,
			jetstream.PullMaxBytes(max(in.cfg.PullMaxBytes, 2*int(in.nc.MaxPayload()))),
			jetstream.PullExpiry(pullExpiry),
			jetstream.ConsumeErrHandler(in.onConsumeError))
		if err != nil {
			err = fmt.Errorf("ingest: start consuming: %w", err)
		} else {
			in.setState(nil)
			in.logConsuming()
			err = in.watch(ctx, cc)
			if errors.Is(err, errHeld) {
				delay = retryMin
				continue // wait for the hold to lift, then consume again
			}
			if err == nil {
				return
			}
			if time.Since(started) > retryMax {
				delay = retryMin
			}
		}
		in.setState(err)
		in.log.Warn("consuming stopped; setting the consumer up again", "err", err)
		for {
			if !sleep(ctx, delay) {
				return
			}
			delay = min(2*delay, retryMax)
			c, err := in.setup(ctx)
			if err == nil {
				cons = c
				break
			}
			if in.cfg.Existing && errors.Is(err, jetstream.ErrStreamNotFound) {
				return // a stream only read is gone: nothing more to consume
			}
			in.setState(fmt.Errorf("ingest: set up streams and consumer: %w", err))
			in.log.Warn("set up streams and consumer failed; retrying", "err", err, "retry_in", delay)
		}
	}
}

// watch waits until ctx is done (nil) or consuming breaks (the reason),
// then stops cc and waits for its last callback.
func (in *Ingester) watch(ctx context.Context, cc jetstream.ConsumeContext) error {
	var reason error
	var hold <-chan time.Time
	if in.cfg.Hold != nil {
		t := time.NewTicker(in.cfg.HoldEvery)
		defer t.Stop()
		hold = t.C
	}
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-cc.Closed():
			return errors.New("ingest: consuming ended unexpectedly")
		case err := <-in.broken:
			reason = fmt.Errorf("ingest: consumer lost: %w", err)
			break wait
		case <-hold:
			if err := in.cfg.Hold(); err != nil {
				in.setState(fmt.Errorf("ingest: paused: %w", err))
				in.log.Warn("ingest paused; messages wait in the stream", "reason", err)
				reason = errHeld
				break wait
			}
		}
	}
	if reason == nil || reason == errHeld {
		// Shutting down: hand the messages already buffered in the
		// client to the handler, which naks them, so they are
		// redelivered at once instead of after AckWait.
		cc.Drain()
	} else {
		cc.Stop()
	}
	select {
	case <-cc.Closed():
	case <-time.After(stopTimeout):
		in.log.Warn("consume did not stop in time", "timeout", stopTimeout)
	}
	return reason
}

// errHeld stops consuming while Config.Hold reports a reason.
var errHeld = errors.New("ingest: paused")

// waitHold returns once Config.Hold allows intake (true) or ctx is
// done (false); while held, Ready reports the reason.
func (in *Ingester) waitHold(ctx context.Context) bool {
	if in.cfg.Hold == nil {
		return true
	}
	paused := false
	for {
		err := in.cfg.Hold()
		if err == nil {
			if paused {
				in.log.Info("ingest resumed")
			}
			return true
		}
		if !paused {
			in.setState(fmt.Errorf("ingest: paused: %w", err))
			paused = true
		}
		if !sleep(ctx, in.cfg.HoldEvery) {
			return false
		}
	}
}

// onConsumeError is called by the consume machinery. Errors that mean
// the consumer is gone ask consume to set it up again; heartbeats missed
// during a connection outage are left to the reconnect logic.
//
// A new leader of an exclusive consumer (its NATS server went away or
// stepped down) is asked to redeliver at once what is not acked
// (resetLoop), while consuming goes on: the deliveries and acks that
// were on their way to the old leader are lost, and the new one would
// deliver those messages again only after the ack wait, while the ack
// floor, and with it the partition's position, stands still.
func (in *Ingester) onConsumeError(_ jetstream.ConsumeContext, err error) {
	switch {
	case errors.Is(err, jetstream.ErrConsumerLeadershipChanged):
		in.log.Info("the consumer has a new leader", "consumer", in.cfg.Consumer)
		if in.cfg.Exclusive {
			select {
			case in.reset <- struct{}{}:
			default:
			}
		}
		return
	case errors.Is(err, jetstream.ErrNoHeartbeat):
		if in.nc.Status() != nats.CONNECTED {
			return
		}
		if in.missedHB.Add(1) < 2 {
			in.log.Warn("missed a heartbeat from the consumer", "err", err)
			return
		}
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrBadRequest):
	default:
		in.log.Warn("consume error", "err", err)
		return
	}
	select {
	case in.broken <- err:
	default:
	}
}

// handler decodes each delivered message and hands it to the batch
// loop. It waits while the decoded readings not yet settled exceed the
// budget (twice MaxBatchReadings), which bounds memory when devices
// send large batches. After ctx is done it naks instead, so the message
// is redelivered at once to whoever consumes next.
func (in *Ingester) handler(ctx context.Context) jetstream.MessageHandler {
	budget := int64(2 * in.cfg.MaxBatchReadings)
	return func(msg jetstream.Msg) {
		in.missedHB.Store(0)
		if ctx.Err() != nil {
			in.nakOnShutdown(msg)
			return
		}
		it := in.prepare(msg)
		n := int64(len(it.readings))
		for in.queued.Load() >= budget {
			select {
			case <-in.freed:
			case <-ctx.Done():
				in.nakOnShutdown(msg)
				return
			}
		}
		in.queued.Add(n)
		select {
		case in.items <- it:
		case <-ctx.Done():
			in.queued.Add(-n)
			in.nakOnShutdown(msg)
		}
	}
}

// release returns n settled readings to the handler's budget.
func (in *Ingester) release(n int) {
	in.queued.Add(-int64(n))
	select {
	case in.freed <- struct{}{}:
	default:
	}
}

func (in *Ingester) nakOnShutdown(msg jetstream.Msg) {
	if err := msg.Nak(); err != nil {
		in.log.Debug("nak on shutdown", "subject", msg.Subject(), "err", err)
	}
}

// prepare reads the metadata, the device from the subject, decodes the
// payload (JSON, or the binary form of package wire when its header
// says so, or of package lpwire on its own subject) and checks the
// accepted window.
func (in *Ingester) prepare(msg jetstream.Msg) item {
	it := item{msg: msg}
	meta, err := msg.Metadata()
	if err != nil {
		it.reject = buckets.Invalid(buckets.CodeInternalFailure, -1, "", "message without JetStream metadata: %v", err)
		return it
	}
	it.seq, it.delivered, it.published = meta.Sequence.Stream, meta.NumDelivered, meta.Timestamp
	if it.delivered > 1 {
		in.m.redeliveries.Add(context.Background(), 1)
	}
	format := ""
	if h := msg.Headers(); len(h) > 0 {
		it.link = trace.SpanContextFromContext(in.prop.Extract(context.Background(), headerCarrier(h)))
		format = h.Get(wire.Header)
	}
	rs, as, binary, err := in.decode(msg.Subject(), format, msg.Data(), meta.Timestamp)
	if err == nil {
		err = checkWindow(rs, in.cfg.Window, in.now())
	}
	if err == nil && binary {
		// A JSON assignment holds as of its reading's time, checked
		// above; a binary one carries its own.
		err = checkAssignWindow(as, in.cfg.Window, in.now())
	}
	if err != nil {
		it.reject = asValidation(err)
		return it
	}
	it.readings, it.assigns = rs, as
	return it
}

// decode decodes the payload of a message stored on subject at
// published, in the form its format header names; binary reports a
// binary form, whose assignments carry their own times.
func (in *Ingester) decode(subject, format string, data []byte, published time.Time) (
	rs []buckets.Reading, as []buckets.Assignment, binary bool, err error) {
	token := in.deviceToken(subject)
	if token == lpwire.Token && format == lpwire.Format {
		// A line protocol write's message of several devices.
		rs, as, err = lpwire.Decode(data, in.ofPartition(subject))
		return rs, as, true, err
	}
	device, err := buckets.ParseDeviceID(token)
	if err != nil {
		return nil, nil, false, err
	}
	if format == wire.Format {
		rs, as, err = wire.Decode(device, data)
		return rs, as, true, err
	}
	def, err := buckets.TicksOf(published)
	if err != nil {
		return nil, nil, false, buckets.Invalid(buckets.CodeInternalFailure, -1, "", "stream timestamp: %v", err)
	}
	rs, as, err = Decode(device, data, def)
	return rs, as, false, err
}

func asValidation(err error) *buckets.ValidationError {
	var ve *buckets.ValidationError
	if errors.As(err, &ve) {
		return ve
	}
	return buckets.Invalid(buckets.CodeInternalFailure, -1, "", "%v", err)
}

// sleep waits d or until ctx is done; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ofPartition is what a line protocol write's message on subject may
// hold: with partitions, only devices of the subject's partition (a
// message that names another is refused whole, so no node stores a
// device it does not own); without, any device.
func (in *Ingester) ofPartition(subject string) func(buckets.DeviceID) error {
	n := in.cfg.Partitions
	if n == 0 {
		return nil
	}
	p := in.cfg.Partition
	if !in.cfg.PartitionStreams {
		rest, _ := strings.CutPrefix(subject, in.cfg.SubjectPrefix+".")
		num, _, _ := strings.Cut(rest, ".")
		var err error
		if p, err = strconv.Atoi(num); err != nil {
			p = -1
		}
	}
	return func(dev buckets.DeviceID) error {
		if q := partition.Of(n, string(dev)); q != p {
			return buckets.Invalid(buckets.CodeInvalidDevice, -1, "device",
				"%s belongs to partition %d of %d, not to %d, whose subject the message came on", dev, q, n, p)
		}
		return nil
	}
}

// resetLoop resets the consumer to its ack floor when asked (a new
// leader, see onConsumeError), until ctx is done. The server then
// redelivers at once everything past the floor to the pulls waiting;
// what was stored already is stored again unchanged. A reset that
// fails leaves the redelivery to the ack wait.
func (in *Ingester) resetLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-in.reset:
		}
		rctx, cancel := context.WithTimeout(ctx, setupTimeout)
		_, err := in.js.ResetConsumer(rctx, in.cfg.Stream, in.cfg.Consumer)
		cancel()
		switch {
		case err == nil:
			in.log.Info("redelivering at once what the consumer's previous leader held", "consumer", in.cfg.Consumer)
		case ctx.Err() == nil:
			in.log.Warn("could not reset the consumer after a change of its leader; what it lost is redelivered after the ack wait",
				"consumer", in.cfg.Consumer, "ack_wait", in.cfg.AckWait, "err", err)
		}
	}
}
