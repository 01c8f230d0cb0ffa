// Package intake answers the devices' JetStream publishes itself, so
// that one fsync covers many of them. JetStream fsyncs (in the mode
// that syncs every write) each published message under its stream's
// lock; an atomic batch is stored all or none and fsynced once. Devices
// publish one message at a time, so the service collects their
// publishes per partition and stores them as one atomic batch into the
// partition's stream:
//
//   - it subscribes to <prefix>.*.* in the service's account, where the
//     server's partition mapping puts every publish on <prefix>.<device>
//     (and where the MQTT listener's QoS 0 forwarder publishes);
//   - a worker per partition takes what is queued (up to MaxBatch
//     messages, at most one of each Nats-Msg-Id), publishes it on the
//     stream's intake subjects (ingest.IntakeSubject) as one atomic
//     batch and, once the batch is stored, replies to each publish in
//     JetStream's PubAck shape ({"stream":..,"seq":..}), so nats.go's and
//     nats.js' Publish and PublishAsync work unchanged; a publish is
//     acked only after its batch is stored;
//   - a publish the batch does not suit (headers that set expectations,
//     a batch of the client's own) and every message of a batch the
//     server refused are handed to the stream one by one, with the
//     client's reply subject: the stream answers them itself, as it
//     would without the intake;
//   - the queue of each partition is bounded in messages and bytes;
//     past the bound a publish is handed to the stream by itself, as
//     it would go without the intake (one fsync each): one device's
//     flood fills its partition's queue, the rest of it goes the slow
//     way, nothing acked is touched and the service's memory stays
//     bounded. A publish without a reply subject (a core publish, the
//     MQTT QoS 0 forwarder's) is stored all the same.
//
// The partition streams must then capture the intake subjects only
// (ingest.Config.Intake): a stream capturing <prefix>.<partition>.*
// would answer the same publish too.
package intake

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// Defaults of Config.
const (
	// DefaultQueueLen bounds the publishes queued per partition.
	DefaultQueueLen = 4096
	// DefaultQueueBytes bounds the bytes queued per partition.
	DefaultQueueBytes = 16 << 20
	// DefaultMaxBatch is the most messages of one atomic batch: the
	// server's default bound.
	DefaultMaxBatch = 1000
	// DefaultLingerBelow: a batch of fewer messages waits Linger for
	// more.
	DefaultLingerBelow = 64
	// DefaultTimeout bounds the wait for a batch's commit ack.
	DefaultTimeout = 10 * time.Second
	// queueGroup lets several connections of the service share the
	// devices' publishes, each answered once.
	queueGroup = "telemetryd-intake"
)

// JetStream's headers the intake reads.
const (
	headerMsgID       = "Nats-Msg-Id"
	headerBatchID     = "Nats-Batch-Id"
	headerBatchSeq    = "Nats-Batch-Sequence"
	headerBatchCommit = "Nats-Batch-Commit"
	// expectPrefix starts the headers that make a publish conditional
	// (Nats-Expected-Stream, -Last-Sequence, ...).
	expectPrefix = "Nats-Expected-"
)

// Config configures an Intake. A zero field takes its default.
type Config struct {
	// SubjectPrefix: devices publish on <prefix>.<device>. Default
	// ingest.DefaultSubjectPrefix.
	SubjectPrefix string
	// Family names the partition streams (partition.Stream). Default
	// "TELEMETRY".
	Family string
	// Partitions is the number of partitions, each with its stream.
	Partitions int
	// QueueLen and QueueBytes bound the publishes queued per partition.
	QueueLen   int
	QueueBytes int
	// MaxBatch bounds the messages of one batch.
	MaxBatch int
	// Linger is how long a batch of fewer than LingerBelow messages
	// waits for more before it is stored (0: not at all).
	Linger      time.Duration
	LingerBelow int
	// Timeout bounds the wait for a batch's commit ack.
	Timeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.SubjectPrefix = cmp.Or(c.SubjectPrefix, ingest.DefaultSubjectPrefix)
	c.Family = cmp.Or(c.Family, ingest.DefaultConfig().Stream)
	c.QueueLen = cmp.Or(c.QueueLen, DefaultQueueLen)
	c.QueueBytes = cmp.Or(c.QueueBytes, DefaultQueueBytes)
	c.MaxBatch = cmp.Or(c.MaxBatch, DefaultMaxBatch)
	c.LingerBelow = cmp.Or(c.LingerBelow, DefaultLingerBelow)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Intake is a running intake; Close stops it.
type Intake struct {
	cfg   Config
	nc    *nats.Conn
	log   *slog.Logger
	sub   *nats.Subscription
	parts []*part
	stop  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
	// refused counts client batches answered with an error; batches and passed
	// count batches stored and messages handed on one by one.
	refused, overflowed, batches, passed atomic.Int64
	// beforeStore, when set, runs before a worker stores what it took
	// (a test holds the worker there).
	beforeStore func()
}

// part is one partition's queue.
type part struct {
	n      int
	stream string
	q      chan *nats.Msg
	bytes  atomic.Int64 // of the messages in q
}

// Start subscribes on nc and runs a worker per partition.
func Start(nc *nats.Conn, cfg Config) (*Intake, error) {
	return start(nc, cfg, nil)
}

// start is Start with the test hook beforeStore.
func start(nc *nats.Conn, cfg Config, beforeStore func()) (*Intake, error) {
	cfg = cfg.withDefaults()
	if err := partition.Validate(cfg.Partitions); err != nil {
		return nil, fmt.Errorf("intake: %w", err)
	}
	in := &Intake{cfg: cfg, nc: nc, log: cfg.Logger, stop: make(chan struct{}), beforeStore: beforeStore}
	for n := range cfg.Partitions {
		in.parts = append(in.parts, &part{n: n, stream: partition.Stream(cfg.Family, n), q: make(chan *nats.Msg, cfg.QueueLen)})
	}
	subject := cfg.SubjectPrefix + ".*.*"
	sub, err := nc.QueueSubscribe(subject, queueGroup, in.receive)
	if err != nil {
		return nil, fmt.Errorf("intake: subscribe %s: %w", subject, err)
	}
	// The subscription's own buffer stays bounded by the client
	// library's default (65,536 messages, 64 MiB); receive empties it
	// into the queues, or answers at once. Past it the library drops (a
	// publish then gets no answer and its client sends it again).
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("intake: subscribe %s: %w", subject, err)
	}
	in.sub = sub
	for _, p := range in.parts {
		// One worker a partition: the stream commits one batch at a
		// time, so a second batch in flight measured no faster.
		in.wg.Go(func() { in.work(p) })
	}
	return in, nil
}

// Close stops taking publishes, stores and answers what is queued, and
// returns once every worker has.
func (in *Intake) Close() {
	in.once.Do(func() {
		// The drained subscription becomes invalid once the server has
		// stopped sending and the last delivered publish's receive has
		// returned; an empty pending count alone can be seen while a
		// receive is still queueing, after which no worker would answer it.
		_ = in.sub.Drain()
		for in.sub.IsValid() && in.nc.IsConnected() {
			time.Sleep(5 * time.Millisecond)
		}
		_ = in.sub.Unsubscribe()
		close(in.stop)
		in.wg.Wait()
	})
}

// Stats are the intake's counts so far.
type Stats struct {
	// Refused: client batches answered with an error; Overflowed:
	// publishes a full queue handed to the stream by themselves;
	// Batches: atomic batches stored; Passed: publishes handed to the
	// stream by themselves (Overflowed included).
	Refused, Overflowed, Batches, Passed int64
}

// Stats returns the counts so far.
func (in *Intake) Stats() Stats {
	return Stats{Refused: in.refused.Load(), Overflowed: in.overflowed.Load(), Batches: in.batches.Load(), Passed: in.passed.Load()}
}

// receive queues one publish for its partition, or answers it at once
// when it cannot be queued.
func (in *Intake) receive(m *nats.Msg) {
	// <prefix>.<partition>.<device>: the partition is the device's, so
	// a publish naming another partition lands in the device's own.
	dev := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	p := in.parts[partition.Of(in.cfg.Partitions, dev)]
	if m.Header.Get(headerBatchID) != "" {
		in.refuse(m, p, 400, 10174, "atomic batch publishes are not taken on "+m.Subject+"; publish message by message")
		return
	}
	size := msgSize(m)
	if p.bytes.Add(size) > int64(in.cfg.QueueBytes) && len(p.q) > 0 {
		p.bytes.Add(-size)
		in.overflow(p, m)
		return
	}
	select {
	case p.q <- m:
	default:
		p.bytes.Add(-size)
		in.overflow(p, m)
	}
}

// overflow hands m, which its partition's full queue cannot take, to
// the stream by itself: the stream stores and answers it (one fsync of
// its own), and the intake holds nothing more.
func (in *Intake) overflow(p *part, m *nats.Msg) {
	in.overflowed.Add(1)
	in.pass(p, m)
}

// refuse answers m with a JetStream API error.
func (in *Intake) refuse(m *nats.Msg, p *part, code, errCode int, desc string) {
	in.refused.Add(1)
	if m.Reply == "" {
		return
	}
	b, _ := json.Marshal(pubAck{Stream: p.stream, Error: &apiError{Code: code, ErrCode: errCode, Description: desc}})
	_ = in.nc.Publish(m.Reply, b)
}

// pubAck is JetStream's answer to a publish and to a batch's commit.
type pubAck struct {
	Stream    string    `json:"stream"`
	Seq       uint64    `json:"seq,omitempty"`
	Duplicate bool      `json:"duplicate,omitempty"`
	Batch     string    `json:"batch,omitempty"`
	Count     int       `json:"count,omitempty"`
	Error     *apiError `json:"error,omitempty"`
}

// apiError is JetStream's API error shape.
type apiError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code,omitempty"`
	Description string `json:"description,omitempty"`
}

// work stores partition p's publishes until Close.
func (in *Intake) work(p *part) {
	batch := make([]*nats.Msg, 0, in.cfg.MaxBatch)
	ids := map[string]struct{}{}
	var next *nats.Msg // the publish that began the next batch
	for {
		m := next
		next = nil
		if m == nil {
			select {
			case m = <-p.q:
			case <-in.stop:
				select {
				case m = <-p.q:
				default:
					return
				}
			}
			p.bytes.Add(-msgSize(m))
		}
		batch, next = in.gather(p, m, batch[:0], ids)
		in.commit(p, batch)
		clear(ids)
		clear(batch)
	}
}

// gather adds m and what is queued behind it to batch, up to MaxBatch
// messages, one of each Nats-Msg-Id (the server refuses a batch that
// repeats one). A publish the batch cannot take ends it: it is passed
// on by itself, or returned to begin the next batch.
func (in *Intake) gather(p *part, m *nats.Msg, batch []*nats.Msg, ids map[string]struct{}) ([]*nats.Msg, *nats.Msg) {
	var linger *time.Timer
	defer func() {
		if linger != nil {
			linger.Stop()
		}
	}()
	for {
		switch {
		case conditional(m):
			in.pass(p, m)
		default:
			id := m.Header.Get(headerMsgID)
			if _, dup := ids[id]; id != "" && dup {
				return batch, m
			}
			if id != "" {
				ids[id] = struct{}{}
			}
			batch = append(batch, m)
		}
		if len(batch) == in.cfg.MaxBatch {
			return batch, nil
		}
		select {
		case m = <-p.q:
			p.bytes.Add(-msgSize(m))
			continue
		default:
		}
		// A small batch waits a moment for more: a batch has a fixed
		// cost (the server stages it in a store of its own).
		if len(batch) >= in.cfg.LingerBelow || in.cfg.Linger <= 0 {
			return batch, nil
		}
		if linger == nil {
			linger = time.NewTimer(in.cfg.Linger)
		}
		select {
		case m = <-p.q:
			p.bytes.Add(-msgSize(m))
		case <-linger.C:
			return batch, nil
		case <-in.stop:
			return batch, nil
		}
	}
}

// msgSize is what receive counted of m.
func msgSize(m *nats.Msg) int64 {
	size := int64(len(m.Data) + len(m.Subject) + len(m.Reply) + 64)
	for k, vs := range m.Header {
		for _, v := range vs {
			size += int64(len(k) + len(v) + 4)
		}
	}
	return size
}

// conditional reports whether m sets expectations on the stream
// (Nats-Expected-*), which a batch does not keep message by message.
func conditional(m *nats.Msg) bool {
	for k := range m.Header {
		if strings.HasPrefix(k, expectPrefix) {
			return true
		}
	}
	return false
}

// commit stores batch as one atomic batch and answers each publish; a
// batch of one, and every message of a batch the server refused, are
// passed on one by one.
func (in *Intake) commit(p *part, batch []*nats.Msg) {
	if in.beforeStore != nil {
		in.beforeStore()
	}
	switch len(batch) {
	case 0:
		return
	case 1:
		in.pass(p, batch[0])
		return
	}
	ack, err := in.publishBatch(p, batch)
	if err != nil {
		in.log.Warn("intake: atomic batch refused; its publishes go to the stream one by one", "stream", p.stream,
			"messages", len(batch), "err", err)
		for _, m := range batch {
			in.pass(p, m)
		}
		return
	}
	in.batches.Add(1)
	first := ack.Seq - uint64(len(batch)) + 1
	buf := make([]byte, 0, 64)
	for i, m := range batch {
		if m.Reply == "" {
			continue
		}
		buf = append(buf[:0], `{"stream":`...)
		buf = strconv.AppendQuote(buf, p.stream)
		buf = append(buf, `,"seq":`...)
		buf = strconv.AppendUint(buf, first+uint64(i), 10)
		buf = append(buf, '}')
		if err := in.nc.Publish(m.Reply, buf); err != nil {
			in.log.Warn("intake: answer a stored publish", "stream", p.stream, "err", err)
			return // the connection is gone: the clients time out and publish again
		}
	}
}

// pass hands m to the stream by itself, with the client's reply
// subject: the stream stores it and answers the client.
func (in *Intake) pass(p *part, m *nats.Msg) {
	in.passed.Add(1)
	out := &nats.Msg{Subject: ingest.IntakeSubject(in.cfg.SubjectPrefix, p.n, deviceOf(m.Subject)), Reply: m.Reply,
		Header: m.Header, Data: m.Data}
	if err := in.nc.PublishMsg(out); err != nil {
		in.log.Warn("intake: hand a publish to the stream", "stream", p.stream, "err", err)
	}
}

// deviceOf is the last token of subject.
func deviceOf(subject string) string { return subject[strings.LastIndexByte(subject, '.')+1:] }

// errBatch wraps a batch the server refused or did not answer.
var errBatch = errors.New("atomic batch not stored")

// publishBatch publishes batch (at least two messages) as one atomic
// batch into p's stream and returns the commit's ack.
func (in *Intake) publishBatch(p *part, batch []*nats.Msg) (pubAck, error) {
	id := nuid.Next()
	last := len(batch) - 1
	for i, m := range batch[:last] {
		if err := in.nc.PublishMsg(in.batchMsg(p, m, id, i+1)); err != nil {
			return pubAck{}, fmt.Errorf("%w: publish: %w", errBatch, err)
		}
	}
	bm := in.batchMsg(p, batch[last], id, last+1)
	bm.Header.Set(headerBatchCommit, "1")
	ctx, cancel := context.WithTimeout(context.Background(), in.cfg.Timeout)
	defer cancel()
	resp, err := in.nc.RequestMsgWithContext(ctx, bm)
	if err != nil {
		return pubAck{}, fmt.Errorf("%w: commit: %w", errBatch, err)
	}
	var ack pubAck
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return pubAck{}, fmt.Errorf("%w: commit ack %q: %w", errBatch, resp.Data, err)
	}
	switch {
	case ack.Error != nil:
		return pubAck{}, fmt.Errorf("%w: %s (%d)", errBatch, ack.Error.Description, ack.Error.ErrCode)
	case ack.Batch != id || ack.Count != len(batch) || ack.Seq < uint64(len(batch)):
		return pubAck{}, fmt.Errorf("%w: the commit ack counts %d messages of batch %q ending at %d, not %d of %q",
			errBatch, ack.Count, ack.Batch, ack.Seq, len(batch), id)
	}
	return ack, nil
}

// batchMsg is m as message seq (from 1) of batch id into p's stream.
func (in *Intake) batchMsg(p *part, m *nats.Msg, id string, seq int) *nats.Msg {
	h := make(nats.Header, len(m.Header)+3)
	for k, v := range m.Header {
		h[k] = v
	}
	h.Set(headerBatchID, id)
	h.Set(headerBatchSeq, strconv.Itoa(seq))
	return &nats.Msg{Subject: ingest.IntakeSubject(in.cfg.SubjectPrefix, p.n, deviceOf(m.Subject)), Header: h, Data: m.Data}
}
