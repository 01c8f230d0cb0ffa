package ingest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ResetConsumer deletes the consumer that has acknowledged readings, so
// that a new Ingester reads the stream again from the saved positions
// (none here: from the start); with no consumer or no stream it does
// nothing.
func TestResetConsumer(t *testing.T) {
	ctx := context.Background()
	e := newTestEnv(t, nil)
	deleted, err := ResetConsumer(ctx, e.js, e.cfg)
	require.NoError(t, err)
	assert.False(t, deleted, "no stream yet")

	e.start()
	seq := e.publish("telemetry.dev-1", flat(nowMillis(), 1))
	e.waitAcked(seq)
	require.NoError(t, e.stop())
	deleted, err = ResetConsumer(ctx, e.js, e.cfg)
	require.NoError(t, err)
	assert.True(t, deleted)
	deleted, err = ResetConsumer(ctx, e.js, e.cfg)
	require.NoError(t, err)
	assert.False(t, deleted, "already deleted")

	// A new Ingester creates the consumer again and delivers the
	// reading a second time: the stream is read again from its start.
	in, err := New(e.nc, e.w, e.cfg)
	require.NoError(t, err)
	e.in = in
	e.start()
	require.Len(t, e.waitStored("dev-1", 2), 2)
}
