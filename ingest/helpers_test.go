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

// assignCall is one Writer.Assign the fake saw.
type assignCall struct {
	assignments []buckets.Assignment
	err         error
}

// fakeWriter records every write and assignment and fails when fail or
// failAssign says so.
type fakeWriter struct {
	mu         sync.Mutex
	calls      []writeCall
	assigns    []assignCall
	fail       func(rs []buckets.Reading) error
	failAssign func(as []buckets.Assignment) error
}

func (w *fakeWriter) Assign(_ context.Context, as []buckets.Assignment) error {
	as = slices.Clone(as)
	w.mu.Lock()
	fail := w.failAssign
	w.mu.Unlock()
	var err error
	if fail != nil {
		err = fail(as)
	}
	w.mu.Lock()
	w.assigns = append(w.assigns, assignCall{assignments: as, err: err})
	w.mu.Unlock()
	return err
}

func (w *fakeWriter) setFailAssign(f func(as []buckets.Assignment) error) {
	w.mu.Lock()
	w.failAssign = f
	w.mu.Unlock()
}

// assigned returns the assignments of successful Assign calls, in call
// order.
func (w *fakeWriter) assigned() []buckets.Assignment {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []buckets.Assignment
	for _, c := range w.assigns {
		if c.err == nil {
			out = append(out, c.assignments...)
		}
	}
	return out
}

// attributes applies the successful assignments as a store does (per
// attribute the newest At wins, the greater value among equal At) and
// returns each device's attributes.
func (w *fakeWriter) attributes() map[buckets.DeviceID]map[string]string {
	type at struct {
		value string
		at    buckets.Ticks
	}
	state := map[buckets.DeviceID]map[string]at{}
	for _, a := range w.assigned() {
		if state[a.Device] == nil {
			state[a.Device] = map[string]at{}
		}
		for _, x := range a.Set {
			if cur, ok := state[a.Device][x.Name]; !ok || a.At > cur.at || a.At == cur.at && x.Value > cur.value {
				state[a.Device][x.Name] = at{x.Value, a.At}
			}
		}
	}
	out := map[buckets.DeviceID]map[string]string{}
	for dev, m := range state {
		out[dev] = map[string]string{}
		for name, v := range m {
			out[dev][name] = v.value
		}
	}
	return out
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
