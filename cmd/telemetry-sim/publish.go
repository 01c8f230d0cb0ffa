package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// asyncPublisher is the part of jetstream.JetStream the simulator uses.
type asyncPublisher interface {
	PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error)
}

// counters are the running totals, in readings except messages.
type counters struct {
	messages   atomic.Int64 // messages handed to the connection
	published  atomic.Int64 // readings in those messages
	acked      atomic.Int64 // readings the stream acknowledged (duplicates included)
	duplicates atomic.Int64 // readings in messages the stream dropped as duplicates
	errors     atomic.Int64 // readings whose publish failed or was nacked
	unacked    atomic.Int64 // readings still unacknowledged when the drain timed out
	pending    atomic.Int64 // messages awaiting their ack
}

// inflight is one published message awaiting its ack.
type inflight struct {
	fut      jetstream.PubAckFuture
	readings int
	span     trace.Span // nil when tracing is off
	buf      *[]byte    // payload buffer, reused once the ack is in
}

// publisher publishes messages asynchronously with at most window
// messages unacknowledged, and counts what the stream acknowledged.
// It owns one goroutine, the collector, which waits for acks in
// publish order; close stops it and waits for it.
type publisher struct {
	js     asyncPublisher
	log    *slog.Logger
	tracer trace.Tracer // nil when tracing is off
	prop   propagation.TextMapPropagator
	spanAt []attribute.KeyValue // attributes every publish span carries

	slots   chan struct{} // one token per unacknowledged message
	queue   chan inflight // publish order; never fuller than slots
	abandon chan struct{} // closed when the drain gives up
	done    chan struct{} // closed when the collector returns
	bufs    sync.Pool

	stats   counters
	errMu   sync.Mutex
	lastErr error // most recent publish error, for progress lines
}

// newPublisher starts the collector. tracer may be nil.
func newPublisher(js asyncPublisher, window int, tracer trace.Tracer, spanAttrs []attribute.KeyValue, log *slog.Logger) *publisher {
	p := &publisher{
		js:      js,
		log:     log,
		tracer:  tracer,
		prop:    propagation.TraceContext{},
		spanAt:  spanAttrs,
		slots:   make(chan struct{}, window),
		queue:   make(chan inflight, window),
		abandon: make(chan struct{}),
		done:    make(chan struct{}),
	}
	p.bufs.New = func() any { b := make([]byte, 0, 512); return &b }
	go p.collect()
	return p
}

// buffer returns a payload buffer; the publisher takes it back once the
// message it carries is acknowledged.
func (p *publisher) buffer() *[]byte { return p.bufs.Get().(*[]byte) }

// publish sends m, waiting for a free slot in the window. buf must be
// the buffer m.data lives in. A failure to hand the message to the
// connection is counted and returned; fatal reports whether
// publishing can go on after it.
func (p *publisher) publish(ctx context.Context, m message, msgID bool, buf *[]byte) error {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	msg := &nats.Msg{Subject: m.subject, Data: m.data, Header: nats.Header{}}
	if msgID {
		msg.Header.Set(jetstream.MsgIDHeader, m.msgID)
	}
	var span trace.Span
	if p.tracer != nil {
		var sctx context.Context
		sctx, span = p.tracer.Start(ctx, "publish "+m.subject, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(p.spanAt...),
			trace.WithAttributes(attribute.String("messaging.destination.name", m.subject),
				attribute.String("messaging.message.id", m.msgID),
				attribute.Int("messaging.batch.message_count", m.readings)))
		p.prop.Inject(sctx, headerCarrier(msg.Header))
	}
	fut, err := p.js.PublishMsgAsync(msg)
	if err != nil {
		<-p.slots
		p.fail(m.readings, span, err)
		p.bufs.Put(buf)
		if errors.Is(err, nats.ErrMaxPayload) {
			return fmt.Errorf("publish %s: message of %d bytes: %w (lower -batch or -values)", m.subject, len(m.data), err)
		}
		return fmt.Errorf("publish %s: %w", m.subject, err)
	}
	p.stats.messages.Add(1)
	p.stats.published.Add(int64(m.readings))
	p.stats.pending.Add(1)
	p.queue <- inflight{fut: fut, readings: m.readings, span: span, buf: buf}
	return nil
}

// collect resolves acks in publish order until the queue is closed.
func (p *publisher) collect() {
	defer close(p.done)
	for it := range p.queue {
		select {
		case ack := <-it.fut.Ok():
			p.stats.acked.Add(int64(it.readings))
			if ack.Duplicate {
				p.stats.duplicates.Add(int64(it.readings))
			}
			if it.span != nil {
				it.span.SetAttributes(attribute.Int64("messaging.nats.stream.sequence", int64(ack.Sequence)),
					attribute.Bool("messaging.nats.duplicate", ack.Duplicate))
				it.span.End()
			}
		case err := <-it.fut.Err():
			p.fail(it.readings, it.span, err)
		case <-p.abandon:
			p.stats.unacked.Add(int64(it.readings))
			if it.span != nil {
				it.span.SetStatus(codes.Error, "no ack before shutdown")
				it.span.End()
			}
		}
		p.stats.pending.Add(-1)
		p.bufs.Put(it.buf)
		<-p.slots
	}
}

// fail counts a failed publish, records it on span, and logs the first
// failure; later ones show up in progress lines as last_error.
func (p *publisher) fail(readings int, span trace.Span, err error) {
	if p.stats.errors.Add(int64(readings)) == int64(readings) {
		p.log.Warn("publish failed; further failures are counted in progress lines", "err", err)
	}
	p.errMu.Lock()
	p.lastErr = err
	p.errMu.Unlock()
	if span != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.End()
	}
}

// fatal reports whether a publish error means no later publish can
// succeed either.
func fatal(err error) bool {
	return errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrMaxPayload) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// takeLastErr returns the most recent publish error and forgets it.
func (p *publisher) takeLastErr() error {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	err := p.lastErr
	p.lastErr = nil
	return err
}

// close stops accepting messages and waits up to timeout for the
// outstanding acks; what is still unacknowledged then is counted as
// unacked. It must be called once, after the last publish returned.
func (p *publisher) close(timeout time.Duration) {
	close(p.queue)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		close(p.abandon)
		<-p.done
	}
}

// headerCarrier adapts NATS headers to OpenTelemetry propagation. NATS
// header keys are case-sensitive, so keys are written exactly as the
// propagator names them ("traceparent"), unlike http.Header which would
// canonicalize them to "Traceparent".
type headerCarrier nats.Header

// Get returns the first value of key.
func (c headerCarrier) Get(key string) string { return nats.Header(c).Get(key) }

// Set replaces the values of key.
func (c headerCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

// Keys lists the keys present.
func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
