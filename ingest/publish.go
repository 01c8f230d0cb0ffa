package ingest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/ingest/partition"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// publishWindow is how many publishes of one Publish call may await
// their acks at once.
const publishWindow = 256

// Atomic batch publishing (Config.AtomicPublish): nats-server (2.12 and
// later) stages the messages of a batch and stores them in the stream
// at its commit, all or none, and on a stream that fsyncs every write
// it fsyncs the commit once instead of once per message. The commit's
// ack says how many messages the batch stored.
const (
	headerBatchID     = "Nats-Batch-Id"
	headerBatchSeq    = "Nats-Batch-Sequence"
	headerBatchCommit = "Nats-Batch-Commit"
	// maxAtomicBatch is the server's default bound on the messages of
	// one atomic batch.
	maxAtomicBatch = 1000
	// minAtomicBatch: fewer messages are published one by one. A batch
	// has a fixed cost (the server stages it in a file store of its own,
	// created and removed per batch: 7 ms without fsync, 14-16 ms with,
	// on a loaded disk whose fsync took 0.5-0.7 ms), so it pays from
	// about 25 messages (BenchmarkPublishSynced).
	minAtomicBatch = 32
	// atomicInFlight bounds one Publisher's batches in flight: the
	// server takes at most 50 per stream (and refuses more).
	atomicInFlight = 16
	// atomicTimeout bounds the wait for a batch's commit ack.
	atomicTimeout = 10 * time.Second
	// errCodeAtomicDisabled is the server's error code for a stream that
	// does not allow atomic batches.
	errCodeAtomicDisabled = 10174
)

// errAtomicUnsupported: the server cannot store atomic batches into the
// stream (too old, or the stream does not allow them).
var errAtomicUnsupported = errors.New("the server does not store atomic batches into the stream")

// Publisher publishes mapped line protocol messages over JetStream:
// readings go to the readings stream, dead letters (rejected.*) to the
// rejected one with their Nats-Msg-Id. The readings stream has no
// duplicate window (streams.go): a retried reading is stored once
// because line protocol readings always carry their time, and the store
// merges readings with the same device and time.
type Publisher struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	subjects topology.Subjects
	stream   string
	// family and partitions: with a stream per partition, a device's
	// readings go to partition.Stream(family, partition.Of(partitions,
	// device)); partitions is 0 otherwise.
	family     string
	partitions int
	// intake: the streams capture IntakeSubject (Config.Intake), where
	// the Publisher publishes.
	intake   bool
	rejected string
	log      *slog.Logger
	// atomic: publish a call's readings as atomic batches; cleared
	// (once, with a warning) when the server turns out not to support
	// them.
	atomic   atomic.Bool
	inFlight chan struct{} // atomic batches in flight
	// lines: publish a call's readings as messages of package lpwire
	// (publishlines.go); recent and suppressed serve their retries.
	lines      bool
	recent     recentIDs
	suppressed atomic.Int64
	now        func() time.Time // Config.Now
}

// NewPublisher returns a Publisher on nc to the streams of c. With
// c.AtomicPublish it publishes the readings of each Publish call as
// atomic batches.
func NewPublisher(nc *nats.Conn, c Config) (*Publisher, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*publishWindow))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	c = c.withDefaults()
	p := &Publisher{nc: nc, js: js, subjects: c.Subjects(), stream: c.Stream, rejected: c.RejectedStream,
		log: c.Logger, inFlight: make(chan struct{}, atomicInFlight)}
	if c.PartitionStreams {
		p.family, p.partitions, p.intake = c.Family(), c.Partitions, c.Intake
	}
	p.atomic.Store(c.AtomicPublish)
	// A single stream partitioned by a subject transform would store a
	// message of several devices under the partition of its token.
	p.lines = c.Partitions == 0 || c.PartitionStreams
	p.now = c.Now
	return p, nil
}

// Suppressed is how many messages Publish left out because their
// streams had acknowledged the same message lately.
func (p *Publisher) Suppressed() int64 { return p.suppressed.Load() }

// Publish sends msgs and waits for every ack; it returns the first
// error. Readings in the binary form of package wire go as messages of
// package lpwire, one per partition (publishlines.go), but where the
// streams are one partitioned by a subject transform; other readings go
// to <prefix>.<device>; a dead letter goes to
// rejected.<prefix>.<device> (topology.InvalidDeviceToken for one
// without a device) with its code and reason in the headers
// topology.HeaderErrorCode and HeaderError.
//
// With Config.AtomicPublish the readings go as atomic batches of up to
// maxAtomicBatch messages, each acked once all of it is stored (and, on
// a JetStream that fsyncs every write, after one fsync); a call or a
// remainder of fewer than minAtomicBatch messages goes message by
// message. A batch the
// server refuses is published again message by message, which stores
// nothing twice (readings merge by device and time) and reports the
// refusal of the message at fault.
func (p *Publisher) Publish(ctx context.Context, msgs []linemsg.Message) error {
	if p.lines {
		out, rest := p.group(msgs)
		if err := p.publishLines(ctx, out); err != nil {
			return err
		}
		if msgs = rest; len(msgs) == 0 {
			return nil
		}
	}
	if !p.atomic.Load() {
		return p.publishEach(ctx, msgs)
	}
	var dead []linemsg.Message
	byStream := map[string][]linemsg.Message{}
	var order []string
	for _, m := range msgs {
		if m.DeadLetter {
			dead = append(dead, m)
			continue
		}
		st := p.streamOf(m.Device)
		if _, ok := byStream[st]; !ok {
			order = append(order, st)
		}
		byStream[st] = append(byStream[st], m)
	}
	// The streams' batches go at once: each stream fsyncs on its own.
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for i, st := range order {
		wg.Go(func() { errs[i] = p.publishStream(ctx, st, byStream[st]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return p.publishEach(ctx, dead)
}

// streamOf is the stream a device's readings go to.
func (p *Publisher) streamOf(device string) string {
	if p.partitions == 0 {
		return p.stream
	}
	return partition.Stream(p.family, partition.Of(p.partitions, device))
}

// publishStream publishes the readings of one stream as atomic
// batches, or message by message where a batch cannot be had.
func (p *Publisher) publishStream(ctx context.Context, stream string, readings []linemsg.Message) error {
	for start := 0; start < len(readings); start += maxAtomicBatch {
		chunk := readings[start:min(start+maxAtomicBatch, len(readings))]
		if len(chunk) >= minAtomicBatch && p.atomic.Load() {
			err := p.publishAtomic(ctx, stream, chunk)
			if err == nil {
				continue
			}
			if ctx.Err() != nil {
				return err
			}
			if errors.Is(err, errAtomicUnsupported) && p.atomic.CompareAndSwap(true, false) {
				p.log.Warn("line protocol writes are published message by message: one fsync per message with -sync-writes", "err", err)
			}
		}
		if err := p.publishEach(ctx, chunk); err != nil {
			return err
		}
	}
	return nil
}

// publishEach publishes msgs one by one, publishWindow at a time, and
// waits for every ack.
func (p *Publisher) publishEach(ctx context.Context, msgs []linemsg.Message) error {
	for start := 0; start < len(msgs); start += publishWindow {
		batch := msgs[start:min(start+publishWindow, len(msgs))]
		futs := make([]jetstream.PubAckFuture, 0, len(batch))
		for _, m := range batch {
			nm := p.natsMsg(&m)
			opts := []jetstream.PublishOpt{jetstream.WithExpectStream(p.streamOf(m.Device))}
			if m.DeadLetter {
				opts = []jetstream.PublishOpt{jetstream.WithMsgID(m.MsgID), jetstream.WithExpectStream(p.rejected)}
			}
			f, err := p.js.PublishMsgAsync(nm, opts...)
			if err != nil {
				return fmt.Errorf("publish to %s: %w", nm.Subject, err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return fmt.Errorf("publish to %s: %w", f.Msg().Subject, err)
			case <-ctx.Done():
				return fmt.Errorf("publish to %s: %w", f.Msg().Subject, ctx.Err())
			}
		}
	}
	return nil
}

// atomicAck is the commit ack of an atomic batch.
type atomicAck struct {
	Stream string `json:"stream"`
	Batch  string `json:"batch"`
	Count  int    `json:"count"`
	Error  *struct {
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// publishAtomic publishes readings (at most maxAtomicBatch, at least 2)
// as one atomic batch: every message but the last without a reply, the
// last with the commit header as a request, whose ack must count them
// all.
func (p *Publisher) publishAtomic(ctx context.Context, stream string, readings []linemsg.Message) error {
	select {
	case p.inFlight <- struct{}{}:
		defer func() { <-p.inFlight }()
	case <-ctx.Done():
		return fmt.Errorf("atomic batch to %s: %w", stream, ctx.Err())
	}
	id := nuid.Next()
	last := len(readings) - 1
	for i := range readings[:last] {
		nm := p.batchMsg(&readings[i], stream, id, i+1)
		if err := p.nc.PublishMsg(nm); err != nil {
			return fmt.Errorf("atomic batch to %s: publish to %s: %w", stream, nm.Subject, err)
		}
	}
	nm := p.batchMsg(&readings[last], stream, id, last+1)
	nm.Header.Set(headerBatchCommit, "1")
	rctx, cancel := context.WithTimeout(ctx, atomicTimeout)
	defer cancel()
	resp, err := p.nc.RequestMsgWithContext(rctx, nm)
	if err != nil {
		return fmt.Errorf("atomic batch of %d messages to %s: %w", len(readings), stream, err)
	}
	var ack atomicAck
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return fmt.Errorf("atomic batch of %d messages to %s: ack %q: %w", len(readings), stream, resp.Data, err)
	}
	switch {
	case ack.Error != nil && ack.Error.ErrCode == errCodeAtomicDisabled:
		return fmt.Errorf("%w: stream %s: %s", errAtomicUnsupported, stream, ack.Error.Description)
	case ack.Error != nil:
		return fmt.Errorf("atomic batch of %d messages to %s: %s (%d)", len(readings), stream, ack.Error.Description, ack.Error.ErrCode)
	case ack.Batch != id || ack.Count != len(readings):
		// A server without atomic batches stores each message as it
		// comes and acks the last one alone.
		return fmt.Errorf("%w: stream %s: the commit ack counts %d messages of batch %q, not %d of %q",
			errAtomicUnsupported, stream, ack.Count, ack.Batch, len(readings), id)
	}
	return nil
}

// batchMsg is reading m as message seq (from 1) of atomic batch id.
func (p *Publisher) batchMsg(m *linemsg.Message, stream, id string, seq int) *nats.Msg {
	nm := p.natsMsg(m)
	nm.Header.Set(jetstream.ExpectedStreamHeader, stream)
	nm.Header.Set(headerBatchID, id)
	nm.Header.Set(headerBatchSeq, strconv.Itoa(seq))
	return nm
}

// deviceSubject is where device's readings are published: its subject,
// or with the intake the intake's subject of its partition.
func (p *Publisher) deviceSubject(device string) string {
	if p.intake {
		return IntakeSubject(p.subjects.Prefix, partition.Of(p.partitions, device), device)
	}
	return p.subjects.Device(device)
}

// natsMsg is m on its subject, with its headers.
func (p *Publisher) natsMsg(m *linemsg.Message) *nats.Msg {
	if !m.DeadLetter {
		nm := nats.NewMsg(p.deviceSubject(m.Device))
		nm.Data = m.Data
		for k, v := range m.Header {
			nm.Header.Set(k, v)
		}
		return nm
	}
	nm := nats.NewMsg(p.subjects.Rejected(cmp.Or(m.Device, topology.InvalidDeviceToken)))
	nm.Data = m.Data
	nm.Header.Set(topology.HeaderErrorCode, string(m.Code))
	nm.Header.Set(topology.HeaderError, m.Reason)
	return nm
}
