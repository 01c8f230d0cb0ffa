package ingest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// TestCheckMapping: streams per partition on a server that does not map
// publishes to them are refused with the mapping to add; once it maps,
// the check passes and has stored nothing.
func TestCheckMapping(t *testing.T) {
	ns, js := mappingServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := DefaultConfig()
	c.Partitions, c.PartitionStreams = 4, true

	err := CheckMapping(ctx, js, c)
	require.Error(t, err, "no mapping: no stream takes the devices' publishes")
	assert.Contains(t, err.Error(), `must map "telemetry.*" to "telemetry.{{partition(4,1)}}.{{wildcard(1)}}"`)

	src, dst := partition.Mapping("telemetry", 4)
	require.NoError(t, ns.GlobalAccount().AddMapping(src, dst))
	require.NoError(t, CheckMapping(ctx, js, c))
	st, err := js.Stream(ctx, "TELEMETRY_0")
	require.NoError(t, err)
	assert.Zero(t, st.CachedInfo().State.Msgs, "the check stores nothing")
}

// TestCheckMappingOtherCount: a server mapping into another partition
// count is refused, naming the mapping wanted, whether its count is a
// multiple of the streams' (some partitions' devices would go to no
// stream) or not (some would go to another partition's stream).
func TestCheckMappingOtherCount(t *testing.T) {
	for _, mapped := range []int{8, 3} {
		t.Run(strconv.Itoa(mapped), func(t *testing.T) {
			ns, js := mappingServer(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			src, dst := partition.Mapping("telemetry", mapped)
			require.NoError(t, ns.GlobalAccount().AddMapping(src, dst))
			c := DefaultConfig()
			c.Partitions, c.PartitionStreams = 4, true
			err := CheckMapping(ctx, js, c)
			require.Error(t, err)
			assert.Contains(t, err.Error(), `must map "telemetry.*" to "telemetry.{{partition(4,1)}}.{{wildcard(1)}}"`)
		})
	}
}

// mappingServer runs a bare server and connects JetStream to it.
func mappingServer(t *testing.T) (*server.Server, jetstream.JetStream) {
	t.Helper()
	ns := runServer(t, t.TempDir(), -1)
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return ns, js
}

// TestHasLeader: a publish nobody answers is a missing mapping only if
// the stream has a leader to answer it; a replicated stream whose
// servers lost their quorum has none, and the mapping check then says
// so instead of asking for a mapping the servers already have.
func TestHasLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srvs, _, js := ingesttest.RunNATSCluster(t, 3)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return hasLeader(ctx, js, "S") }, 30*time.Second, 50*time.Millisecond)
	for _, s := range srvs[1:] {
		s.Shutdown()
		s.WaitForShutdown()
	}
	require.Eventually(t, func() bool {
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		defer scancel()
		return !hasLeader(sctx, js, "S")
	}, 30*time.Second, 100*time.Millisecond, "a stream on one of its three servers has no leader")

	_, lone := ingesttest.JetStream(t)
	_, err = lone.CreateStream(ctx, jetstream.StreamConfig{Name: "L", Subjects: []string{"l.>"}})
	require.NoError(t, err)
	assert.True(t, hasLeader(ctx, lone, "L"), "a lone server's stream")
}
