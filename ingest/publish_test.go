package ingest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/lineproto"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// TestPublisherSendsReadingsAndDeadLettersToTheirStreams: a reading goes
// to the readings stream and is stored; a dead letter goes to the
// rejected stream, once however often it is published (its message
// ID).
func TestPublisherSendsReadingsAndDeadLettersToTheirStreams(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	p, err := NewPublisher(e.nc, e.cfg)
	require.NoError(t, err)
	subjects := e.cfg.Subjects()
	dl := lineproto.Message{Subject: subjects.Rejected("dev-2"), Data: []byte("bad line"), MsgID: "dl-1",
		Header: map[string]string{topology.HeaderErrorCode: "invalid_payload"}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Publish(ctx, []lineproto.Message{
		{Subject: subjects.Device("dev-1"), Data: []byte(flat(nowMillis(), 1)), MsgID: "r-1"}, dl,
	}))
	require.NoError(t, p.Publish(ctx, []lineproto.Message{dl}))
	e.waitStored("dev-1", 1)
	got := e.waitDeadLetters(1)
	time.Sleep(100 * time.Millisecond)
	assert.Len(t, e.deadLetters(), 1, "a dead letter published twice is kept once")
	assert.Equal(t, "invalid_payload", got[0].Header.Get(topology.HeaderErrorCode))

	err = p.Publish(ctx, []lineproto.Message{{Subject: "elsewhere.dev-1", Data: []byte("{}")}})
	assert.ErrorContains(t, err, "publish to elsewhere.dev-1", "a subject no stream captures is an error")
}
