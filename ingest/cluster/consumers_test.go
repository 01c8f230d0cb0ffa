package cluster

import (
	"context"
	"testing"
	"time"

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

// TestStepDownMovesTheConsumerLeader: on a three-server JetStream
// cluster, StepDown moves an R3 consumer's leadership to another
// server; on a lone server (nothing to move to) it fails, naming the
// consumer.
func TestStepDownMovesTheConsumerLeader(t *testing.T) {
	ctx := context.Background()
	_, loneJS := ingesttest.JetStream(t)
	_, err := loneJS.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	require.NoError(t, err)
	_, err = loneJS.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	err = (&partitionConsumer{js: loneJS, stream: "S", consumer: "c"}).StepDown(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "consumer c")

	_, _, js := ingesttest.RunNATSCluster(t, 3)
	var st jetstream.Stream
	require.Eventually(t, func() bool {
		st, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "the cluster never took the stream: %v", err)
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, Replicas: 3})
	require.NoError(t, err)
	leader := func() string {
		info, err := cons.Info(ctx)
		if err != nil || info.Cluster == nil {
			return ""
		}
		return info.Cluster.Leader
	}
	require.Eventually(t, func() bool { return leader() != "" }, 30*time.Second, 50*time.Millisecond)
	before := leader()
	pc := &partitionConsumer{js: js, stream: "S", consumer: "c"}
	require.Eventually(t, func() bool { return pc.StepDown(ctx) == nil }, 30*time.Second, 200*time.Millisecond,
		"step down refused while every replica is current")
	require.Eventually(t, func() bool { l := leader(); return l != "" && l != before }, 30*time.Second, 50*time.Millisecond,
		"the leader stayed on %s", before)
}
