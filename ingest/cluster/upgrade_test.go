package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// TestOldStreamStep: the one stream of the earlier layout stays while
// an owner has no consumer there, while an owner's consumer or a
// consumer of a node that is down has messages pending or unacked, and
// while it received a message less than Quiet ago; a live node's
// leftover consumer of a partition it does not own does not hold it.
// Then it is deleted, and a later step finds it gone.
func TestOldStreamStep(t *testing.T) {
	_, js := ingesttest.JetStream(t)
	ctx := context.Background()
	tr := partition.Transform("telemetry", 2)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TELEMETRY", Subjects: []string{"telemetry.*"}, SubjectTransform: &tr})
	require.NoError(t, err)
	var devs [2]string // a device of each partition
	for i := 0; devs[0] == "" || devs[1] == ""; i++ {
		d := fmt.Sprintf("dev-%d", i)
		devs[partition.Of(2, d)] = d
	}
	for _, d := range devs {
		_, err := js.Publish(ctx, "telemetry."+d, []byte(`{}`))
		require.NoError(t, err)
	}
	consumer := func(node string, p int) jetstream.Consumer {
		c, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: ConsumerName(node, p),
			AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: partition.Filter("telemetry", p)})
		require.NoError(t, err)
		return c
	}
	settle := func(c jetstream.Consumer) {
		batch, err := c.FetchNoWait(10)
		require.NoError(t, err)
		for m := range batch.Messages() {
			require.NoError(t, m.DoubleAck(ctx))
		}
	}
	now := time.Now()
	live := []string{"a", "b"}
	o := &OldStream{JS: js, Family: "TELEMETRY", Partitions: 2, Quiet: time.Minute,
		Owners: func(p int) []string { return []string{"a", "b"} },
		Live:   func() []string { return live }, Now: func() time.Time { return now }}
	// waits steps once and checks that the stream stays for the reason
	// named.
	waits := func(reason string) {
		t.Helper()
		gone, err := o.Step(ctx)
		require.NoError(t, err)
		require.False(t, gone, reason)
		assert.Contains(t, o.waiting, reason)
	}

	a0, a1, b0 := consumer("a", 0), consumer("a", 1), consumer("b", 0)
	settle(a0)
	settle(a1)
	settle(b0)
	waits("node b to drain partition 1") // the first look starts the quiet time
	now = now.Add(2 * time.Minute)
	b1 := consumer("b", 1)
	waits("consumer ingest-b-p1 (1 pending")
	settle(b1)
	down := consumer("c", 1) // c is down: it may own partition 1 again
	waits("consumer ingest-c-p1 (1 pending")
	live = append(live, "c") // c is back, and owns no partition: its consumer is a leftover
	_, err = js.Publish(ctx, "telemetry."+devs[1], []byte(`{}`))
	require.NoError(t, err)
	settle(a1)
	settle(b1)
	waits("less than 1m0s ago")
	now = now.Add(2 * time.Minute)
	info, err := down.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, info.NumPending, "the leftover still has messages pending")
	gone, err := o.Step(ctx)
	require.NoError(t, err)
	require.True(t, gone, "settled and quiet; a live non-owner's leftover does not count (waiting for %s)", o.waiting)
	_, err = js.Stream(ctx, "TELEMETRY")
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	gone, err = o.Step(ctx)
	require.NoError(t, err)
	assert.True(t, gone)
}
