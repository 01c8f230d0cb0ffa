package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeFuture is a PubAckFuture the test resolves by hand.
type fakeFuture struct {
	msg *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error
}

func (f *fakeFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *fakeFuture) Err() <-chan error            { return f.err }
func (f *fakeFuture) Msg() *nats.Msg               { return f.msg }

// fakeJS records publishes and hands out unresolved futures.
type fakeJS struct {
	mu      sync.Mutex
	futures []*fakeFuture
	failed  error // returned by every publish when set
}

func (js *fakeJS) PublishMsgAsync(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	js.mu.Lock()
	defer js.mu.Unlock()
	if js.failed != nil {
		return nil, js.failed
	}
	f := &fakeFuture{msg: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	js.futures = append(js.futures, f)
	return f, nil
}

func (js *fakeJS) published() int {
	js.mu.Lock()
	defer js.mu.Unlock()
	return len(js.futures)
}

func (js *fakeJS) future(i int) *fakeFuture {
	js.mu.Lock()
	defer js.mu.Unlock()
	return js.futures[i]
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testMessage(i int) message {
	return message{subject: "telemetry.sim-0001", msgID: "sim-0001-" + string(rune('a'+i)), readings: 10, data: []byte(`[]`)}
}

func TestPublisherWindowBoundsUnackedMessages(t *testing.T) {
	js := &fakeJS{}
	p := newPublisher(js, 3, nil, nil, discardLogger())
	errc := make(chan error, 1)
	go func() {
		for i := range 10 {
			if err := p.publish(context.Background(), testMessage(i), true, p.buffer()); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	require.Eventually(t, func() bool { return js.published() == 3 }, 2*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, 3, js.published(), "a fourth message went out with three unacked")

	for i := range 10 {
		require.Eventually(t, func() bool { return js.published() > i }, 2*time.Second, time.Millisecond)
		assert.LessOrEqual(t, js.published()-i, 3, "more than the window outstanding")
		f := js.future(i)
		switch {
		case i == 4:
			f.err <- errors.New("stream full")
		case i >= 8:
			f.ok <- &jetstream.PubAck{Stream: "TELEMETRY", Sequence: uint64(i), Duplicate: true}
		default:
			f.ok <- &jetstream.PubAck{Stream: "TELEMETRY", Sequence: uint64(i)}
		}
	}
	require.NoError(t, <-errc)
	p.close(time.Second)
	s := p.summary("count", time.Second)
	assert.Equal(t, summary{Stopped: "count", Messages: 10, Published: 100, Acked: 90, Duplicates: 20, Errors: 10, Elapsed: time.Second}, s)
	assert.Equal(t, "sim-0001-a", js.future(0).msg.Header.Get(jetstream.MsgIDHeader))
}

func TestPublisherNoMsgIDWhenOff(t *testing.T) {
	js := &fakeJS{}
	p := newPublisher(js, 1, nil, nil, discardLogger())
	require.NoError(t, p.publish(context.Background(), testMessage(0), false, p.buffer()))
	js.future(0).ok <- &jetstream.PubAck{Stream: "TELEMETRY", Sequence: 1}
	p.close(time.Second)
	assert.Empty(t, js.future(0).msg.Header)
}

func TestPublisherCloseGivesUpOnMissingAcks(t *testing.T) {
	js := &fakeJS{}
	p := newPublisher(js, 4, nil, nil, discardLogger())
	for i := range 3 {
		require.NoError(t, p.publish(context.Background(), testMessage(i), true, p.buffer()))
	}
	js.future(0).ok <- &jetstream.PubAck{Stream: "TELEMETRY", Sequence: 1}
	start := time.Now()
	p.close(100 * time.Millisecond)
	assert.Less(t, time.Since(start), time.Second)
	s := p.summary("signal", time.Second)
	assert.Equal(t, int64(10), s.Acked)
	assert.Equal(t, int64(20), s.Unacked)
	assert.Equal(t, int64(0), p.stats.pending.Load())
}

func TestPublisherWaitForSlotStopsOnCancel(t *testing.T) {
	js := &fakeJS{}
	p := newPublisher(js, 1, nil, nil, discardLogger())
	require.NoError(t, p.publish(context.Background(), testMessage(0), true, p.buffer()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, p.publish(ctx, testMessage(1), true, p.buffer()), context.DeadlineExceeded)
	assert.Equal(t, 1, js.published())
	p.close(10 * time.Millisecond)
	assert.Equal(t, int64(10), p.summary("", 0).Unacked)
}

func TestPublisherImmediateFailures(t *testing.T) {
	tests := []struct {
		err   error
		fatal bool
	}{
		{nats.ErrReconnectBufExceeded, false},
		{nats.ErrConnectionClosed, true},
		{nats.ErrMaxPayload, true},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			js := &fakeJS{failed: tt.err}
			p := newPublisher(js, 1, nil, nil, discardLogger())
			for range 3 { // the slot is released after each failure
				err := p.publish(context.Background(), testMessage(0), true, p.buffer())
				require.ErrorIs(t, err, tt.err)
				assert.Equal(t, tt.fatal, fatal(err))
			}
			p.close(time.Second)
			s := p.summary("error", 0)
			assert.Equal(t, int64(30), s.Errors)
			assert.Equal(t, int64(0), s.Published)
			assert.Equal(t, tt.err, p.takeLastErr())
			assert.Nil(t, p.takeLastErr())
		})
	}
}
