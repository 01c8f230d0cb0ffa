package ingest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/buckets"
)

// A traceparent header links the batch span to the publisher's span, and
// the write runs inside the batch span.
func TestIngestLinksPublisherTrace(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.MaxBatchWait = time.Second })
	e.setup()
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	ms := nowMillis()
	e.publishMsg(&nats.Msg{Subject: "telemetry.dev-1", Data: []byte(flat(ms, 1)),
		Header: nats.Header{"traceparent": []string{"00-" + traceID + "-" + spanID + "-01"}}})
	e.publishMsg(&nats.Msg{Subject: "telemetry.dev-2", Data: []byte(flat(ms, 2)),
		Header: nats.Header{"Traceparent": []string{"00-11111111111111111111111111111111-2222222222222222-01"}}})
	last := e.publish("telemetry.dev-3", flat(ms, 3))
	e.start()
	e.waitAcked(last)

	var batch tracetest.SpanStub
	require.Eventually(t, func() bool {
		for _, s := range e.spans.GetSpans() {
			if s.Name == "ingest.batch" {
				batch = s
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond)
	require.Len(t, e.w.snapshot(), 1, "all three messages in one batch")
	assert.Equal(t, trace.SpanKindConsumer, batch.SpanKind)
	var linked []string
	for _, l := range batch.Links {
		linked = append(linked, l.SpanContext.TraceID().String()+"/"+l.SpanContext.SpanID().String())
	}
	assert.ElementsMatch(t, []string{traceID + "/" + spanID, "11111111111111111111111111111111/2222222222222222"}, linked)
	assert.False(t, batch.Parent.IsValid(), "a batch span is a root linked to its publishers")

	write := e.w.snapshot()[0].span
	assert.Equal(t, batch.SpanContext.TraceID(), write.TraceID())
	assert.Equal(t, batch.SpanContext.SpanID(), write.SpanID(), "the store commit is a child of the batch span")
}

// Cancelling Run with a batch in flight commits and acks it before Run
// returns.
func TestIngestShutdownCommitsInFlightBatch(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.MaxBatchWait = time.Minute })
	e.start()
	ms := nowMillis()
	var last uint64
	for i := range 3 {
		last = e.publish("telemetry.dev-1", flat(ms+int64(i), i))
	}
	require.Eventually(t, func() bool { return e.in.queued.Load() == 3 }, 5*time.Second, 10*time.Millisecond,
		"the ingester holds the messages in its batch")
	assert.Empty(t, e.w.snapshot(), "nothing committed before the batch wait")

	require.NoError(t, e.stop())
	calls := e.w.snapshot()
	require.Len(t, calls, 1)
	assert.Len(t, calls[0].readings, 3)
	info := e.consumerInfo()
	assert.Equal(t, 0, info.NumAckPending, "acked before Run returned")
	assert.Equal(t, last, info.AckFloor.Stream)
}

// When the server goes away, Ready says so; when it comes back with its
// state, consumption resumes.
func TestIngestResumesAfterServerRestart(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	e.waitAcked(e.publish("telemetry.dev-1", flat(nowMillis(), 1)))

	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	require.Eventually(t, func() bool { return e.in.Ready() != nil }, 5*time.Second, 10*time.Millisecond)
	assert.ErrorContains(t, e.in.Ready(), "NATS connection is")

	e.srv = runServer(t, e.dir, e.port)
	require.Eventually(t, func() bool { return e.nc.Status() == nats.CONNECTED }, 10*time.Second, 10*time.Millisecond)
	seq := e.publish("telemetry.dev-1", flat(nowMillis(), 2))
	e.waitStored("dev-1", 2)
	e.waitAcked(seq)
	assert.NoError(t, e.in.Ready())
	require.NoError(t, e.stop())
}

// A server that comes back without its state (a fresh store) gets the
// streams and the consumer again.
func TestIngestRecreatesLostStreamsAndConsumer(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	e.waitAcked(e.publish("telemetry.dev-1", flat(nowMillis(), 1)))

	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	e.dir = t.TempDir()
	e.srv = runServer(t, e.dir, e.port)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := e.js.Stream(ctx, "TELEMETRY")
		return err == nil && e.in.Ready() == nil
	}, 30*time.Second, 50*time.Millisecond, "streams not recreated; ready: %v", e.in.Ready())
	seq := e.publish("telemetry.dev-1", flat(nowMillis(), 2))
	e.waitStored("dev-1", 2)
	e.waitAcked(seq)
	require.NoError(t, e.stop())
}

func TestIngestRecreatesDeletedConsumer(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	e.waitAcked(e.publish("telemetry.dev-1", flat(nowMillis(), 1)))

	require.NoError(t, e.js.DeleteConsumer(context.Background(), "TELEMETRY", "ingest"))
	seq := e.publish("telemetry.dev-1", flat(nowMillis(), 2))
	e.waitStored("dev-1", 2)
	e.waitAcked(seq)
	assert.Contains(t, e.logs.String(), "setting the consumer up again")
}

// Writes that take a while do not stop intake: messages keep being
// decoded while a batch is committed, and none is lost or duplicated.
func TestIngestUnderLoad(t *testing.T) {
	n := 5000
	if testing.Short() {
		n = 1000
	}
	e := newTestEnv(t, func(c *Config) { c.MaxBatchReadings = 500 })
	var inFlight, overlap atomic.Int32
	e.w.setFail(func([]buckets.Reading) error {
		if inFlight.Add(1) > 1 {
			overlap.Add(1)
		}
		time.Sleep(2 * time.Millisecond)
		inFlight.Add(-1)
		return nil
	})
	e.start()
	ms := nowMillis()
	var last uint64
	for i := range n {
		last = e.publish(fmt.Sprintf("telemetry.dev-%d", i%10), flat(ms+int64(i/10), i))
	}
	e.waitAcked(last)
	stored := e.w.stored("")
	assert.Len(t, stored, n)
	seen := map[int64]bool{}
	for _, r := range stored {
		v, _ := r.Get("v")
		assert.False(t, seen[v.AsInt()], "reading %d written twice", v.AsInt())
		seen[v.AsInt()] = true
	}
	assert.Zero(t, overlap.Load(), "one Write at a time")
	for _, c := range e.w.snapshot() {
		assert.LessOrEqual(t, len(c.readings), 500)
	}
}

// While the store is slow, the decoded readings waiting for it stay
// within twice the batch size (plus the message being handed over), so
// large device batches cannot exhaust memory.
func TestIngestBoundsQueuedReadings(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.MaxBatchReadings = 10 })
	release := make(chan struct{})
	e.w.setFail(func([]buckets.Reading) error {
		<-release
		return nil
	})
	e.setup()
	ms := nowMillis()
	var last uint64
	for i := range 100 {
		p := fmt.Sprintf("[%s,%s,%s,%s,%s]", flat(ms, i), flat(ms+1, i), flat(ms+2, i), flat(ms+3, i), flat(ms+4, i))
		last = e.publish(fmt.Sprintf("telemetry.dev-%d", i), p)
	}
	e.start()
	require.Eventually(t, func() bool { return e.in.queued.Load() > 0 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	assert.LessOrEqual(t, e.in.queued.Load(), int64(2*10+5))
	close(release)
	e.waitAcked(last)
	assert.Len(t, e.w.stored(""), 500)
	assert.Zero(t, e.in.queued.Load())
}
