package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/bucketstest"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
)

// runServer starts an in-process NATS server with JetStream storing
// under dir, on port (-1 for a random one).
func runServer(t testing.TB, dir string, port int) *server.Server {
	t.Helper()
	return ingesttest.RunNATS(t, func(o *server.Options) { o.StoreDir, o.Port = dir, port })
}

// writeCall is one Writer.Write the fake saw.
type writeCall struct {
	readings []buckets.Reading
	span     trace.SpanContext // the span in the write's context
	err      error
}

// fakeWriter records every write and fails when fail says so.
type fakeWriter struct {
	mu    sync.Mutex
	calls []writeCall
	fail  func(rs []buckets.Reading) error
}

func (w *fakeWriter) Write(ctx context.Context, rs []buckets.Reading) error {
	rs = slices.Clone(rs)
	w.mu.Lock()
	fail := w.fail
	w.mu.Unlock()
	var err error
	if fail != nil {
		err = fail(rs) // outside the lock: it may block
	}
	w.mu.Lock()
	w.calls = append(w.calls, writeCall{readings: rs, span: trace.SpanContextFromContext(ctx), err: err})
	w.mu.Unlock()
	return err
}

func (w *fakeWriter) setFail(f func(rs []buckets.Reading) error) {
	w.mu.Lock()
	w.fail = f
	w.mu.Unlock()
}

func (w *fakeWriter) snapshot() []writeCall {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.calls)
}

// stored returns the readings of successful writes, for device when
// it is not empty.
func (w *fakeWriter) stored(device buckets.DeviceID) []buckets.Reading {
	var out []buckets.Reading
	for _, c := range w.snapshot() {
		if c.err != nil {
			continue
		}
		for _, r := range c.readings {
			if device == "" || r.Device == device {
				out = append(out, r)
			}
		}
	}
	return out
}

// attempts counts the writes (failed or not) that held device.
func (w *fakeWriter) attempts(device buckets.DeviceID) int {
	n := 0
	for _, c := range w.snapshot() {
		if hasDevice(c.readings, device) {
			n++
		}
	}
	return n
}

func hasDevice(rs []buckets.Reading, device buckets.DeviceID) bool {
	return slices.ContainsFunc(rs, func(r buckets.Reading) bool { return r.Device == device })
}

// testEnv is a NATS server, a connection, a fake writer and an Ingester
// with in-memory traces and metrics.
type testEnv struct {
	t       testing.TB
	srv     *server.Server
	dir     string
	port    int
	nc      *nats.Conn
	js      jetstream.JetStream
	w       *fakeWriter
	in      *Ingester
	cfg     Config
	logs    *bucketstest.SyncBuffer
	metrics *sdkmetric.ManualReader
	spans   *tracetest.InMemoryExporter

	cancel context.CancelFunc
	done   chan error
}

// newTestEnv builds the environment; mod adjusts the config. The
// Ingester is not running yet (see start).
func newTestEnv(t testing.TB, mod func(*Config)) *testEnv {
	t.Helper()
	e := &testEnv{t: t, dir: t.TempDir(), w: &fakeWriter{}, logs: &bucketstest.SyncBuffer{}}
	e.srv = runServer(t, e.dir, -1)
	e.port = e.srv.Addr().(*net.TCPAddr).Port
	nc, err := nats.Connect(e.srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectJitter(0, 0), nats.NoCallbacksAfterClientClose())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	e.nc = nc
	e.js, err = jetstream.New(nc)
	require.NoError(t, err)

	e.metrics = sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.metrics))
	e.spans = tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(e.spans))
	e.cfg = Config{
		MaxBatchWait:   20 * time.Millisecond,
		AckWait:        2 * time.Second,
		BackOff:        []time.Duration{20 * time.Millisecond, 50 * time.Millisecond},
		Logger:         slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		TracerProvider: tp,
		MeterProvider:  mp,
	}
	if mod != nil {
		mod(&e.cfg)
	}
	e.in, err = New(nc, e.w, e.cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		if e.cancel != nil {
			e.cancel()
			<-e.done
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("ingester log:\n%s", e.logs.String())
		}
	})
	return e
}

// start runs the Ingester until the test ends and waits until it is
// ready.
func (e *testEnv) start() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel, e.done = cancel, make(chan error, 1)
	go func() { e.done <- e.in.Run(ctx) }()
	require.Eventually(e.t, func() bool { return e.in.Ready() == nil }, 10*time.Second, 10*time.Millisecond,
		"ingester not ready: %v", e.in.Ready())
}

// setup creates the streams and the consumer without consuming, so a
// test can fill the stream before start.
func (e *testEnv) setup() {
	e.t.Helper()
	_, err := e.in.setup(context.Background())
	require.NoError(e.t, err)
}

// stop cancels Run and returns its result.
func (e *testEnv) stop() error {
	e.t.Helper()
	e.cancel()
	select {
	case err := <-e.done:
		e.cancel = nil
		return err
	case <-time.After(15 * time.Second):
		e.t.Fatal("Run did not return after cancel")
		return nil
	}
}

// publish stores payload on subject and returns its stream sequence.
func (e *testEnv) publish(subject, payload string) uint64 {
	e.t.Helper()
	return e.publishMsg(&nats.Msg{Subject: subject, Data: []byte(payload)})
}

func (e *testEnv) publishMsg(m *nats.Msg) uint64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := e.js.PublishMsg(ctx, m)
	require.NoError(e.t, err)
	return ack.Sequence
}

func (e *testEnv) consumerInfo() *jetstream.ConsumerInfo {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.js.Consumer(ctx, "TELEMETRY", "ingest")
	require.NoError(e.t, err)
	info, err := c.Info(ctx)
	require.NoError(e.t, err)
	return info
}

// deadLetters returns the messages of the rejected stream.
func (e *testEnv) deadLetters() []*jetstream.RawStreamMsg {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, "TELEMETRY_REJECTED")
	require.NoError(e.t, err)
	info, err := st.Info(ctx)
	require.NoError(e.t, err)
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		require.NoError(e.t, err)
		out = append(out, m)
	}
	return out
}

// waitDeadLetters waits until the rejected stream holds n messages.
func (e *testEnv) waitDeadLetters(n int) []*jetstream.RawStreamMsg {
	e.t.Helper()
	var got []*jetstream.RawStreamMsg
	require.Eventually(e.t, func() bool {
		got = e.deadLetters()
		return len(got) >= n
	}, 10*time.Second, 20*time.Millisecond, "want %d dead letters", n)
	return got
}

// waitStored waits until the writer stored n readings of device.
func (e *testEnv) waitStored(device buckets.DeviceID, n int) []buckets.Reading {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return len(e.w.stored(device)) >= n }, 10*time.Second, 10*time.Millisecond,
		"want %d stored readings of %s, have %d", n, device, len(e.w.stored(device)))
	return e.w.stored(device)
}

// waitAcked waits until the consumer has nothing pending and has
// delivered the stream up to seq.
func (e *testEnv) waitAcked(seq uint64) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		info := e.consumerInfo()
		return info.NumAckPending == 0 && info.AckFloor.Stream >= seq
	}, 10*time.Second, 10*time.Millisecond, "messages up to %d not acked", seq)
}

// collect returns the current metrics by instrument name.
func (e *testEnv) collect() map[string]metricdata.Aggregation {
	e.t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(e.t, e.metrics.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// counter returns the value of an int64 counter for exactly attrs.
func (e *testEnv) counter(name string, attrs ...attribute.KeyValue) int64 {
	e.t.Helper()
	sum, ok := e.collect()[name].(metricdata.Sum[int64])
	if !ok {
		return 0
	}
	want := attribute.NewSet(attrs...)
	for _, dp := range sum.DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Value
		}
	}
	return 0
}

func outcome(s string) attribute.KeyValue { return attribute.String("outcome", s) }

// nowMillis is an epoch-milliseconds timestamp inside the window.
func nowMillis() int64 { return time.Now().UnixMilli() }

func flat(ms int64, v int) string { return fmt.Sprintf(`{"ts":%d,"v":%d}`, ms, v) }
