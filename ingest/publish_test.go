package ingest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// TestPublisherSendsReadingsAndDeadLettersToTheirStreams: a reading goes
// to its device's subject in the readings stream and is stored; a dead
// letter goes to the rejected stream on its device's rejected subject
// (the invalid-device token for one without a device), with its code
// and reason in headers, once however often it is published (its
// message ID).
func TestPublisherSendsReadingsAndDeadLettersToTheirStreams(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	p, err := NewPublisher(e.nc, e.cfg)
	require.NoError(t, err)
	subjects := e.cfg.Subjects()
	dl := linemsg.Message{Device: "dev-2", DeadLetter: true, Code: "invalid_payload", Reason: "line 1: bad",
		Data: []byte("bad line"), MsgID: "dl-1"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Publish(ctx, []linemsg.Message{
		{Device: "dev-1", Data: []byte(flat(nowMillis(), 1)), MsgID: "r-1"}, dl,
	}))
	require.NoError(t, p.Publish(ctx, []linemsg.Message{dl}))
	e.waitStored("dev-1", 1)
	got := e.waitDeadLetters(1)
	time.Sleep(100 * time.Millisecond)
	assert.Len(t, e.deadLetters(), 1, "a dead letter published twice is kept once")
	assert.Equal(t, subjects.Rejected("dev-2"), got[0].Subject)
	assert.Equal(t, "invalid_payload", got[0].Header.Get(topology.HeaderErrorCode))
	assert.Equal(t, "line 1: bad", got[0].Header.Get(topology.HeaderError))

	require.NoError(t, p.Publish(ctx, []linemsg.Message{{DeadLetter: true, Code: "invalid_device", Data: []byte("x"), MsgID: "dl-2"}}))
	got = e.waitDeadLetters(2)
	assert.Equal(t, subjects.Rejected(topology.InvalidDeviceToken), got[1].Subject, "a dead letter without a device")

	other := e.cfg
	other.SubjectPrefix = "elsewhere"
	q, err := NewPublisher(e.nc, other)
	require.NoError(t, err)
	err = q.Publish(ctx, []linemsg.Message{{Device: "dev-1", Data: []byte("{}")}})
	assert.ErrorContains(t, err, "publish to elsewhere.dev-1", "a subject no stream captures is an error")
}

// streamMsgs returns the messages of the readings stream.
func (e *testEnv) streamMsgs() []*jetstream.RawStreamMsg {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, "TELEMETRY")
	require.NoError(e.t, err)
	info, err := st.Info(ctx)
	require.NoError(e.t, err)
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		if m, err := st.GetMsg(ctx, seq); err == nil && m.Subject != noDedupSubject("TELEMETRY") {
			out = append(out, m)
		}
	}
	return out
}

// readingMsgs is n reading messages over 10 devices, each at its own
// time.
func readingMsgs(n int) []linemsg.Message {
	ms := nowMillis()
	msgs := make([]linemsg.Message, n)
	for i := range msgs {
		msgs[i] = linemsg.Message{Device: fmt.Sprintf("dev-%d", i%10), Data: []byte(flat(ms+int64(i), i))}
	}
	return msgs
}

// TestPublisherPublishesAtomicBatches: with AtomicPublish the readings
// of one Publish call go into the stream as atomic batches of at most
// maxAtomicBatch messages (each stored message names its batch and its
// place in it), a remainder under minAtomicBatch and a dead letter on
// their own; every reading is stored.
func TestPublisherPublishesAtomicBatches(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.AtomicPublish = true })
	e.start()
	p, err := NewPublisher(e.nc, e.cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := maxAtomicBatch + minAtomicBatch - 1
	msgs := readingMsgs(n)
	msgs = append(msgs, linemsg.Message{Device: "dev-1", DeadLetter: true, Code: "invalid_payload", Reason: "line 1: bad",
		Data: []byte("bad line"), MsgID: "dl-1"})
	require.NoError(t, p.Publish(ctx, msgs))
	for d := range 10 {
		e.waitStored(buckets.DeviceID(fmt.Sprintf("dev-%d", d)), n/10)
	}
	e.waitDeadLetters(1)

	stored := e.streamMsgs()
	require.Len(t, stored, n)
	batches := map[string][]string{} // batch ID -> sequence headers in stream order
	for _, m := range stored {
		batches[m.Header.Get(headerBatchID)] = append(batches[m.Header.Get(headerBatchID)], m.Header.Get(headerBatchSeq))
	}
	require.Len(t, batches, 2, "a batch and the messages on their own")
	for id, seqs := range batches {
		if id == "" {
			assert.Len(t, seqs, minAtomicBatch-1, "the remainder under %d messages on its own", minAtomicBatch)
			continue
		}
		require.Len(t, seqs, maxAtomicBatch)
		for i, s := range seqs {
			assert.Equal(t, strconv.Itoa(i+1), s, "a batch's messages are stored in order")
		}
	}

	require.NoError(t, p.Publish(ctx, readingMsgs(minAtomicBatch)))
	ids := map[string]int{}
	for _, m := range e.streamMsgs()[n:] {
		ids[m.Header.Get(headerBatchID)]++
	}
	assert.Len(t, ids, 1, "a write of %d messages is one batch", minAtomicBatch)
	assert.NotContains(t, ids, "")
}

// TestPublisherWithoutAtomicStreamPublishesEachMessage: when the stream
// does not allow atomic batches, Publish stores every reading message by
// message, warns once and publishes later calls the same way.
func TestPublisherWithoutAtomicStreamPublishesEachMessage(t *testing.T) {
	e := newTestEnv(t, nil) // the stream does not allow atomic batches
	e.start()
	cfg := e.cfg
	cfg.AtomicPublish = true
	p, err := NewPublisher(e.nc, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msgs := readingMsgs(2 * minAtomicBatch)
	require.NoError(t, p.Publish(ctx, msgs[:minAtomicBatch]))
	require.NoError(t, p.Publish(ctx, msgs[minAtomicBatch:]))
	for d := range 10 {
		e.waitStored(buckets.DeviceID(fmt.Sprintf("dev-%d", d)), 2*minAtomicBatch/10)
	}
	stored := e.streamMsgs()
	assert.Len(t, stored, 2*minAtomicBatch, "each reading stored once")
	assert.Equal(t, 1, strings.Count(e.logs.String(), "published message by message"), "one warning")
	assert.False(t, p.atomic.Load())
}
