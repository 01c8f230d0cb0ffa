// Package ingest consumes device readings from NATS JetStream and
// commits them to storage (ingest/README.md).
//
// Devices publish JSON on <prefix>.<device>; the stream TELEMETRY keeps
// the messages and the durable pull consumer "ingest" delivers them.
// Each message is decoded and validated as a whole (Decode and the
// accepted time window). Valid messages are gathered into batches of up
// to MaxBatchReadings readings or MaxBatchWait; the attribute
// assignments they carry are applied with one Writer.Assign, their
// readings written with ONE Writer.Write, and they are acked only after
// both returned nil.
//
// A message that breaks a rule is never stored: its original payload is
// republished to rejected.<prefix>.<device> (stream TELEMETRY_REJECTED)
// with the headers Telemetry-Error-Code and Telemetry-Error, then the
// original is terminated. A failed write is not acked: the batch is
// retried message by message (so one poison message cannot hold back
// other devices), and what still fails is nak'ed with the back-off of
// its delivery count. A message whose own write still fails at its last
// allowed delivery goes to the dead letter subject with code
// max_deliveries. A failure of the store rather than of the message (a
// full disk, a damaged table, its file system gone) never does: the
// message waits in the stream until the store writes again, and the
// server delivers it as often as that takes (the consumer's MaxDeliver
// is unbounded), so restarts, power cuts and writes that outlived
// their ack wait never turn an acked reading into a dead letter.
//
// Validation errors carry the reading's index in its message: 0 for a
// payload that is a single object, -1 for errors about the message as a
// whole (see Decode).
//
// Acks are plain (fire and forget): an ack lost on the way, like a crash
// between commit and ack, only causes a redelivery that writes the same
// keys and values again. Waiting for the server's confirmation of every
// ack would cost a round trip per message and buy nothing. Only at
// shutdown, once intake has stopped, are the acks of the last batches
// confirmed one by one, so that Run returns with everything acked.
package ingest

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
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/buckets"
)

// Writer is what the ingester needs from storage (implemented by
// store.Store). Write commits readings atomically per day table; an
// error wrapping buckets.ErrInvalidReading is permanent, any other is
// retried. Assign applies attribute assignments, the newest by At
// winning per attribute, so applying one again changes nothing; a
// *buckets.ValidationError (such as a device left with more than
// buckets.MaxAttributes attributes) is permanent, any other error is
// retried. Neither may keep its slice after it returns.
type Writer interface {
	Write(ctx context.Context, rs []buckets.Reading) error
	Assign(ctx context.Context, as []buckets.Assignment) error
}

// Ingester consumes the telemetry stream into a Writer. Create it with
// New and run it with Run.
type Ingester struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	w      Writer
	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	m      *metrics

	items     chan item             // decoded messages, from the consume handler to the batch loop
	queued    atomic.Int64          // readings sent on items and not yet settled
	freed     chan struct{}         // signals the handler that queued went down
	broken    chan error            // asks the consume loop to rebuild the consumer
	reset     chan struct{}         // asks resetLoop to redeliver what a lost consumer leader held
	missedHB  atomic.Int32          // consecutive missed heartbeats while connected
	rejectLog LogSampler            // samples the "message rejected" line
	started   atomic.Bool           // Run was called
	state     atomic.Pointer[error] // why not ready; nil when consuming
	syncAcks  bool                  // wait for ack confirmations; owned by the batch loop
	settled   atomic.Int64          // messages settled since the pacer last looked
	window    atomic.Int64          // the consumer's MaxAckPending (backpressure.go)

	mu          sync.Mutex
	stream      jetstream.Stream       // cfg.Stream, once set up
	cons        jetstream.Consumer     // the durable consumer, once set up
	saved       buckets.StreamPosition // last position saved; owned by savePositions, then Run
	startSeq    uint64                 // stream's last sequence when the consumer was set up
	dedupPrefix string                 // of dead letter message IDs, see setup
}

// Errors Ready reports.
var (
	errNotStarted = errors.New("ingest: consumer not set up yet")
	errStopped    = errors.New("ingest: stopped")
)

// New checks cfg and returns an Ingester reading from nc and writing to
// w. Zero fields of cfg take their defaults (DefaultConfig).
func New(nc *nats.Conn, w Writer, cfg Config) (*Ingester, error) {
	if nc == nil || w == nil {
		return nil, errors.New("ingest: nil NATS connection or writer")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("ingest: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("ingest: jetstream: %w", err)
	}
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m, err := newMetrics(mp)
	if err != nil {
		return nil, fmt.Errorf("ingest: metrics: %w", err)
	}
	in := &Ingester{
		nc:        nc,
		js:        js,
		w:         w,
		cfg:       cfg,
		log:       cfg.Logger,
		tracer:    tp.Tracer(instrumentationName),
		prop:      propagation.TraceContext{},
		m:         m,
		items:     make(chan item, 1024),
		freed:     make(chan struct{}, 1),
		broken:    make(chan error, 1),
		reset:     make(chan struct{}, 1),
		rejectLog: LogSampler{Burst: rejectLogBurst, Interval: rejectLogInterval},
	}
	in.window.Store(int64(min(minAckPending, cfg.MaxAckPending))) // slow start, see backpressure.go
	if err := in.observeWindow(mp); err != nil {
		return nil, fmt.Errorf("ingest: metrics: %w", err)
	}
	in.setState(errNotStarted)
	return in, nil
}

// Run creates or updates both streams and the consumer, then consumes
// until ctx is done. It then stops intake, commits and acks the batch in
// flight, and returns nil. It returns an error only when the streams or
// the consumer cannot be set up for a reason retrying will not fix (the
// server refused the configuration). Run may be called once.
func (in *Ingester) Run(ctx context.Context) error {
	if !in.started.CompareAndSwap(false, true) {
		return errors.New("ingest: Run called twice")
	}
	defer in.setState(errStopped)

	cons, err := in.setupUntilDone(ctx)
	if err != nil {
		return err
	}
	if cons == nil { // ctx done before the consumer existed
		return nil
	}
	var wg sync.WaitGroup
	wg.Go(func() { in.savePositions(ctx) })
	wg.Go(func() { in.pace(ctx) })
	wg.Go(func() { in.trimLoop(ctx) })
	wg.Go(func() { in.resetLoop(ctx) })
	intakeDone := make(chan struct{})
	wg.Go(func() {
		defer close(intakeDone)
		in.consume(ctx, cons)
	})
	in.batchLoop(ctx, intakeDone)

	wg.Wait()
	// Acks are buffered publishes: put them on the wire before returning.
	// (While disconnected they wait in the reconnect buffer instead.)
	if in.nc.Status() == nats.CONNECTED {
		if err := in.nc.FlushTimeout(5 * time.Second); err != nil {
			in.log.Warn("flush acks on shutdown", "err", err)
		}
	}
	// Every settled message is acked and confirmed: save where the
	// stream is settled up to, for a consumer created anew. Without a
	// connection the last periodic save stands (shutdown must not wait
	// for a server that is gone).
	if in.nc.Status() == nats.CONNECTED {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalPositionTimeout)
		in.savePosition(sctx)
		cancel()
	}
	in.log.Info("ingest stopped")
	return nil
}

// Ready returns nil while the NATS connection is up and the consumer is
// consuming, and otherwise an error saying why not (for /readyz).
func (in *Ingester) Ready() error {
	if st := in.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("ingest: NATS connection is %s", st)
	}
	if p := in.state.Load(); p != nil {
		return *p
	}
	return nil
}

// setState records why the ingester is not ready; nil means consuming.
func (in *Ingester) setState(err error) {
	if err == nil {
		in.state.Store(nil)
		return
	}
	in.state.Store(&err)
}

// now returns the injected clock's time.
func (in *Ingester) now() time.Time { return in.cfg.Now() }
