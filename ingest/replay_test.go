package ingest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/telemetryd/telemetryd/buckets"
)

// fakeTombs is a Tombstones with settable drops.
type fakeTombs struct {
	mu      sync.Mutex
	drops   map[buckets.Day]time.Time
	deletes map[buckets.DeviceID]time.Time
	gate    sync.RWMutex
}

func (f *fakeTombs) DroppedAt(d buckets.Day) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.drops[d]
	return at, ok
}

func (f *fakeTombs) DeletedAt(d buckets.DeviceID) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.deletes[d]
	return at, ok
}

func (f *fakeTombs) HoldDrops() func() { f.gate.RLock(); return f.gate.RUnlock }

func (f *fakeTombs) deleteDevice(d buckets.DeviceID) {
	f.gate.Lock()
	defer f.gate.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deletes == nil {
		f.deletes = map[buckets.DeviceID]time.Time{}
	}
	f.deletes[d] = time.Now()
}

func (f *fakeTombs) drop(d buckets.Day) {
	f.gate.Lock()
	defer f.gate.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drops[d] = time.Now()
}

// fakePositions is a Positions in memory.
type fakePositions struct {
	mu  sync.Mutex
	pos map[string]buckets.StreamPosition
}

func (f *fakePositions) LoadPosition(_ context.Context, stream string) (buckets.StreamPosition, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pos[stream]
	return p, ok, nil
}

func (f *fakePositions) SavePosition(_ context.Context, p buckets.StreamPosition) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pos[p.Stream] = p
	return nil
}

func (f *fakePositions) get(stream string) buckets.StreamPosition {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pos[stream]
}

// Readings of a dropped day in messages published before the drop are
// skipped and counted; the message is acked; readings of other days in
// the same message (with the message's attributes), and readings of the
// day published after the drop, are stored.
func TestIngestSkipsReadingsOfADayDroppedAfterPublication(t *testing.T) {
	tombs := &fakeTombs{drops: map[buckets.Day]time.Time{}}
	e := newTestEnv(t, func(c *Config) { c.Tombstones = tombs })
	e.setup()
	now := time.Now()
	yesterday := buckets.DayOfTime(now) - 1
	old := yesterday.Start().Time().Add(time.Hour).UnixMilli()
	fresh := now.Add(-time.Second).UnixMilli()
	e.publish("telemetry.dev-1", fmt.Sprintf(`{"ts":%d,"v":1,"attributes":{"a":"1"}}`, old))
	e.publish("telemetry.dev-1", fmt.Sprintf(`[{"ts":%d,"v":2,"attributes":{"b":"2"}},{"ts":%d,"v":3}]`, old+1, fresh))
	tombs.drop(yesterday)
	time.Sleep(2 * time.Millisecond)
	last := e.publish("telemetry.dev-1", flat(old+2, 4))
	e.start()
	e.waitAcked(last)

	var vs []int64
	for _, r := range e.w.stored("dev-1") {
		vs = append(vs, r.Values[0].Value.AsInt())
	}
	assert.ElementsMatch(t, []int64{3, 4}, vs, "kept: the other day's reading and the one published after the drop")
	assert.Equal(t, map[buckets.DeviceID]map[string]string{"dev-1": {"b": "2"}}, e.w.attributes(),
		"a message with a reading kept applies its attributes; one with every reading skipped does not")
	assert.Equal(t, int64(2), e.counter("telemetry.ingest.readings",
		attribute.String("outcome", "skipped"), attribute.String("code", "day_dropped")))
	assert.Equal(t, int64(3), e.counter("telemetry.ingest.messages", outcome("acked")))
	assert.Empty(t, e.deadLetters())
}

// The ack floor is saved; a consumer created anew starts after it.
func TestIngestRecreatedConsumerStartsAfterSavedPosition(t *testing.T) {
	pos := &fakePositions{pos: map[string]buckets.StreamPosition{}}
	e := newTestEnv(t, func(c *Config) { c.Positions = pos; c.PositionEvery = 20 * time.Millisecond })
	e.start()
	var last uint64
	for i := range 5 {
		last = e.publish("telemetry.dev-1", flat(nowMillis()+int64(i), i))
	}
	e.waitAcked(last)
	require.Eventually(t, func() bool { return pos.get("TELEMETRY").Seq == last }, 5*time.Second, 10*time.Millisecond)

	ctx := context.Background()
	require.NoError(t, e.js.DeleteConsumer(ctx, "TELEMETRY", "ingest"))
	next := e.publish("telemetry.dev-1", flat(nowMillis()+10, 10))
	e.waitStored("dev-1", 6)
	e.waitAcked(next)
	info := e.consumerInfo()
	assert.Equal(t, jetstream.DeliverByStartSequencePolicy, info.Config.DeliverPolicy)
	assert.Equal(t, last+1, info.Config.OptStartSeq)
	assert.Len(t, e.w.stored("dev-1"), 6, "nothing written twice")

	// A position of an earlier stream of the same name is ignored.
	require.NoError(t, e.stop())
	require.NoError(t, e.js.DeleteStream(ctx, "TELEMETRY"))
	e2 := newTestEnv(t, func(c *Config) { c.Positions = pos })
	_ = e2 // a fresh server: its stream is new, the saved position is stale
	e2.setup()
	info2 := e2.consumerInfo()
	assert.Equal(t, jetstream.DeliverAllPolicy, info2.Config.DeliverPolicy)
}

// A store that lacks what its durable consumer acked (an emptied data
// dir under the same consumer name, or a store that lost writes) gets
// those messages again: the consumer is created again after the store's
// saved position, or at the start of the stream when it has none,
// instead of resuming past them.
func TestIngestConsumerAheadOfTheStoreStartsAgain(t *testing.T) {
	pos := &fakePositions{pos: map[string]buckets.StreamPosition{}}
	e := newTestEnv(t, func(c *Config) { c.Positions = pos; c.PositionEvery = 20 * time.Millisecond })
	e.start()
	var last uint64
	for i := range 5 {
		last = e.publish("telemetry.dev-1", flat(nowMillis()+int64(i), i))
	}
	e.waitAcked(last)
	require.Eventually(t, func() bool { return pos.get("TELEMETRY").Seq == last }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, e.stop())

	for _, tc := range []struct {
		name  string
		saved map[string]buckets.StreamPosition
		want  int // readings the new store gets from the stream
	}{
		{"emptied data dir", map[string]buckets.StreamPosition{}, 5},
		{"store lost its last writes", map[string]buckets.StreamPosition{"TELEMETRY": {Stream: "TELEMETRY", Seq: 2, Created: pos.get("TELEMETRY").Created}}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &fakeWriter{}
			cfg := e.cfg
			cfg.Positions = &fakePositions{pos: tc.saved}
			in, err := New(e.nc, w, cfg)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- in.Run(ctx) }()
			defer func() { cancel(); <-done }()
			require.Eventually(t, func() bool { return len(w.stored("dev-1")) == tc.want }, 10*time.Second, 10*time.Millisecond,
				"the store gets the acked messages it lacks; has %d", len(w.stored("dev-1")))
		})
	}
}

// Readings and attribute assignments of a device deleted after their
// message was published are skipped and counted, the message acked;
// another device's messages, and what the deleted device publishes
// after the delete, are stored.
func TestIngestSkipsReadingsOfADeviceDeletedAfterPublication(t *testing.T) {
	tombs := &fakeTombs{drops: map[buckets.Day]time.Time{}}
	e := newTestEnv(t, func(c *Config) { c.Tombstones = tombs })
	e.setup()
	ms := time.Now().Add(-time.Minute).UnixMilli()
	e.publish("telemetry.dev-1", fmt.Sprintf(`{"ts":%d,"v":1,"attributes":{"a":"1"}}`, ms))
	e.publish("telemetry.dev-1", fmt.Sprintf(`[{"ts":%d,"v":2},{"ts":%d,"v":3}]`, ms+1, ms+2))
	e.publish("telemetry.dev-2", fmt.Sprintf(`{"ts":%d,"v":10,"attributes":{"a":"2"}}`, ms))
	tombs.deleteDevice("dev-1")
	time.Sleep(2 * time.Millisecond)
	last := e.publish("telemetry.dev-1", fmt.Sprintf(`{"ts":%d,"v":4,"attributes":{"b":"2"}}`, ms+3))
	e.start()
	e.waitAcked(last)

	values := func(dev buckets.DeviceID) []int64 {
		var vs []int64
		for _, r := range e.w.stored(dev) {
			vs = append(vs, r.Values[0].Value.AsInt())
		}
		return vs
	}
	assert.Equal(t, []int64{4}, values("dev-1"), "only the reading published after the delete")
	assert.Equal(t, []int64{10}, values("dev-2"))
	assert.Equal(t, map[buckets.DeviceID]map[string]string{"dev-1": {"b": "2"}, "dev-2": {"a": "2"}}, e.w.attributes(),
		"the deleted device's attributes from before the delete are not applied")
	assert.Equal(t, int64(3), e.counter("telemetry.ingest.readings",
		attribute.String("outcome", "skipped"), attribute.String("code", "device_deleted")))
	assert.Equal(t, int64(4), e.counter("telemetry.ingest.messages", outcome("acked")))
	assert.Empty(t, e.deadLetters())
}

// hiddenConsumer is a store with no saved position whose first load,
// the moment after the ingester looked its durable consumer up and did
// not find it, has that consumer appear with everything acked: the
// lookup of a JetStream server that did not know the consumer yet (back
// from an outage), while the consumer lives on in the cluster.
type hiddenConsumer struct {
	fakePositions
	once   sync.Once
	appear func()
}

func (h *hiddenConsumer) LoadPosition(ctx context.Context, stream string) (buckets.StreamPosition, bool, error) {
	h.once.Do(h.appear)
	return h.fakePositions.LoadPosition(ctx, stream)
}

// An emptied store whose consumer the set-up lookup missed: creating it
// then updates the existing consumer, which keeps its ack floor. The
// set-up checks the consumer it got, deletes it and creates it again,
// so the store gets every message instead of resuming past them.
func TestIngestConsumerTheLookupMissedStartsAgain(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	var last uint64
	for i := range 5 {
		last = e.publish("telemetry.dev-1", flat(nowMillis()+int64(i), i))
	}
	e.waitAcked(last)
	acked := e.consumerInfo()
	require.NoError(t, e.stop())
	ctx := context.Background()
	require.NoError(t, e.js.DeleteConsumer(ctx, "TELEMETRY", "ingest"))

	w := &fakeWriter{}
	cfg := e.cfg
	h := &hiddenConsumer{fakePositions: fakePositions{pos: map[string]buckets.StreamPosition{}}}
	h.appear = func() {
		// The consumer as it lived on: same name and settings, every
		// message acked.
		c, err := e.js.CreateOrUpdateConsumer(ctx, "TELEMETRY", acked.Config)
		require.NoError(t, err)
		msgs, err := c.Fetch(5, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		for m := range msgs.Messages() {
			require.NoError(t, m.DoubleAck(ctx))
		}
		info, err := c.Info(ctx)
		require.NoError(t, err)
		require.Equal(t, last, info.AckFloor.Stream)
	}
	cfg.Positions = h
	in, err := New(e.nc, w, cfg)
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(rctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { return len(w.stored("dev-1")) == 5 }, 15*time.Second, 10*time.Millisecond,
		"the store gets the acked messages it lacks; has %d", len(w.stored("dev-1")))
}
