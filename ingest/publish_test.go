package ingest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets/lineproto"
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
	dl := lineproto.Message{Device: "dev-2", DeadLetter: true, Code: "invalid_payload", Reason: "line 1: bad",
		Data: []byte("bad line"), MsgID: "dl-1"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Publish(ctx, []lineproto.Message{
		{Device: "dev-1", Data: []byte(flat(nowMillis(), 1)), MsgID: "r-1"}, dl,
	}))
	require.NoError(t, p.Publish(ctx, []lineproto.Message{dl}))
	e.waitStored("dev-1", 1)
	got := e.waitDeadLetters(1)
	time.Sleep(100 * time.Millisecond)
	assert.Len(t, e.deadLetters(), 1, "a dead letter published twice is kept once")
	assert.Equal(t, subjects.Rejected("dev-2"), got[0].Subject)
	assert.Equal(t, "invalid_payload", got[0].Header.Get(topology.HeaderErrorCode))
	assert.Equal(t, "line 1: bad", got[0].Header.Get(topology.HeaderError))

	require.NoError(t, p.Publish(ctx, []lineproto.Message{{DeadLetter: true, Code: "invalid_device", Data: []byte("x"), MsgID: "dl-2"}}))
	got = e.waitDeadLetters(2)
	assert.Equal(t, subjects.Rejected(topology.InvalidDeviceToken), got[1].Subject, "a dead letter without a device")

	other := e.cfg
	other.SubjectPrefix = "elsewhere"
	q, err := NewPublisher(e.nc, other)
	require.NoError(t, err)
	err = q.Publish(ctx, []lineproto.Message{{Device: "dev-1", Data: []byte("{}")}})
	assert.ErrorContains(t, err, "publish to elsewhere.dev-1", "a subject no stream captures is an error")
}
