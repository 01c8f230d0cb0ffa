package cluster

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/ingesttest"
)

// TestPartitionConsumersRemove: a handed-over partition's durable
// consumer, named after the node, is deleted; the other node's and
// partition's stay, and removing one already gone is no error.
func TestPartitionConsumersRemove(t *testing.T) {
	nc, js := ingesttest.JetStream(t)
	ctx := context.Background()
	stream := ingest.DefaultConfig().Stream
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"telemetry.>"}})
	require.NoError(t, err)
	for _, name := range []string{ConsumerName("node-1", 3), ConsumerName("node-1", 4), ConsumerName("node-2", 3)} {
		_, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy})
		require.NoError(t, err)
	}
	assert.Equal(t, "ingest-node-1-p3", ConsumerName("node-1", 3))

	pc := PartitionConsumers{NC: nc, Node: "node-1", Template: ingest.DefaultConfig()}
	require.NoError(t, pc.Remove(ctx, 3))
	_, err = s.Consumer(ctx, "ingest-node-1-p3")
	assert.ErrorIs(t, err, jetstream.ErrConsumerNotFound)
	for _, name := range []string{"ingest-node-1-p4", "ingest-node-2-p3"} {
		_, err = s.Consumer(ctx, name)
		assert.NoError(t, err, name)
	}
	assert.NoError(t, pc.Remove(ctx, 3), "already gone")
}
