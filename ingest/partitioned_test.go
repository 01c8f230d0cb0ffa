package ingest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

func partitionedConfig(partitions, p int) Config {
	cfg := DefaultConfig()
	cfg.Partitions, cfg.Partition = partitions, p
	cfg.Consumer = fmt.Sprintf("ingest-p%d", p)
	cfg.Window = buckets.Window{Retention: 100 * 365 * 24 * time.Hour, MaxFutureSkew: time.Hour}
	return cfg
}

// runFor runs an Ingester until ctx ends and returns Run's error.
func runFor(t *testing.T, nc *nats.Conn, w Writer, cfg Config, d time.Duration) error {
	t.Helper()
	in, err := New(nc, w, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return in.Run(ctx)
}

// TestPartitionedConsumerReadsItsPartition: a partitioned ingester
// stores the devices of its partition only, named by the subject the
// stream stored them under, and reports itself caught up.
func TestPartitionedConsumerReadsItsPartition(t *testing.T) {
	srv := runServer(t, t.TempDir(), -1)
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	w := &fakeWriter{}
	cfg := partitionedConfig(4, 2)
	in, ctx := runIngester(t, nc, w, cfg)
	require.Eventually(t, func() bool { return in.Ready() == nil }, 10*time.Second, 10*time.Millisecond)

	js, err := jetstream.New(nc)
	require.NoError(t, err)
	want := map[buckets.DeviceID]bool{}
	for i := range 40 {
		dev := fmt.Sprintf("dev-%d", i)
		_, err := js.Publish(ctx, "telemetry."+dev, []byte(`{"ts":1795309323456,"v":1}`))
		require.NoError(t, err)
		if partition.Of(4, dev) == 2 {
			want[buckets.DeviceID(dev)] = true
		}
	}
	require.NotEmpty(t, want)
	require.Eventually(t, func() bool { return len(w.stored("")) == len(want) }, 10*time.Second, 10*time.Millisecond)
	for _, r := range w.stored("") {
		assert.True(t, want[r.Device], "%s is not in partition 2", r.Device)
	}
	require.Eventually(t, func() bool {
		ok, err := in.CaughtUp(ctx)
		return err == nil && ok
	}, 10*time.Second, 20*time.Millisecond)
}

// TestPartitionCountIsFixed: a stream partitioned into 4 refuses an
// ingester of another count and a single-node ingester; an unpartitioned
// stream refuses a partitioned ingester. Each error names both counts.
func TestPartitionCountIsFixed(t *testing.T) {
	srv := runServer(t, t.TempDir(), -1)
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	w := &fakeWriter{}

	require.NoError(t, runFor(t, nc, w, partitionedConfig(4, 0), 500*time.Millisecond))
	err = runFor(t, nc, w, partitionedConfig(8, 0), 5*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "partitioned into 4, not -partitions 8")
	assert.Contains(t, err.Error(), "Changing the partition count")

	single := DefaultConfig()
	err = runFor(t, nc, w, single, 5*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "partitioned into 4; a single node (-partitions 0) cannot read it")

	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.NoError(t, js.DeleteStream(context.Background(), "TELEMETRY"))
	require.NoError(t, runFor(t, nc, w, single, 500*time.Millisecond))
	err = runFor(t, nc, w, partitionedConfig(4, 1), 5*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not partitioned, so it cannot serve -partitions 4")
}

func TestPartitionConfigChecks(t *testing.T) {
	for _, c := range []struct {
		partitions, p int
		mqtt          bool
		want          string
	}{
		{0, 1, false, "partition 1 without partitions"},
		{4, 4, false, "partition 4: want 0 to 3"},
		{4, -1, false, "partition -1"},
		{partition.Max + 1, 0, false, "want 1 to 1024"},
		{4, 0, true, "MQTT listener's store copies cannot be captured by a partitioned stream"},
	} {
		cfg := DefaultConfig()
		cfg.Partitions, cfg.Partition, cfg.MQTTCopies = c.partitions, c.p, c.mqtt
		_, err := New(&nats.Conn{}, &fakeWriter{}, cfg)
		assert.ErrorContains(t, err, c.want)
	}
}

// TestExclusiveConsumerRedeliversAtOnceWhatAKilledRunLeftUnacked: a
// process took messages from its durable consumer and was killed
// before it acked them. Started again with the same consumer, a node's
// ingester (Exclusive) stores them at once, not after the ack wait,
// and only then reports the partition caught up.
func TestExclusiveConsumerRedeliversAtOnceWhatAKilledRunLeftUnacked(t *testing.T) {
	srv := runServer(t, t.TempDir(), -1)
	cfg := partitionedConfig(1, 0)
	cfg.Consumer = "ingest-node-a-p0"
	cfg.Exclusive = true
	cfg.AckWait = 30 * time.Second // what the deliveries would wait out

	// The first run takes every message and never commits one.
	nc1, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	release := make(chan struct{})
	stuck := &fakeWriter{}
	stuck.setFail(func([]buckets.Reading) error { <-release; return errors.New("killed") })
	first, err := New(nc1, stuck, cfg)
	require.NoError(t, err)
	ctx1, cancel1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() { done1 <- first.Run(ctx1) }()
	t.Cleanup(func() { close(release); cancel1(); <-done1 })
	require.Eventually(t, func() bool { return first.Ready() == nil }, 10*time.Second, 10*time.Millisecond)

	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	const n = 20
	for i := range n {
		_, err := js.Publish(context.Background(), fmt.Sprintf("telemetry.dev-%d", i), []byte(`{"ts":1795309323456,"v":1}`))
		require.NoError(t, err)
	}
	cons, err := js.Consumer(context.Background(), cfg.Stream, cfg.Consumer)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(context.Background())
		return err == nil && info.NumAckPending == n
	}, 10*time.Second, 10*time.Millisecond, "the first run holds every message unacked")
	nc1.Close() // killed: its deliveries stay pending on the server

	// Started again: every message is stored well within the ack wait.
	w := &fakeWriter{}
	in, ctx := runIngester(t, nc, w, cfg)
	started := time.Now()
	require.Eventually(t, func() bool { return len(w.stored("")) == n }, cfg.AckWait/3, 20*time.Millisecond,
		"the killed run's deliveries were not redelivered at once")
	require.Eventually(t, func() bool {
		ok, err := in.CaughtUp(ctx)
		return err == nil && ok
	}, cfg.AckWait/3, 20*time.Millisecond)
	t.Logf("stored and caught up %s after the restart (ack wait %s)", time.Since(started).Round(time.Millisecond), cfg.AckWait)
	assert.Empty(t, stuck.stored(""))
}

// runIngester runs an Ingester of cfg on nc writing to w until the test
// ends, and returns it with the context it runs under.
func runIngester(t *testing.T, nc *nats.Conn, w Writer, cfg Config) (*Ingester, context.Context) {
	t.Helper()
	in, err := New(nc, w, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return in, ctx
}
