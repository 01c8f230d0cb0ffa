package cluster

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// requireLayout checks that every partition is consumed and answered
// for by exactly its desired owners, as every live node sees it.
func requireLayout(t *testing.T, c *testCluster) {
	t.Helper()
	for p := range c.partitions {
		want := slices.Sorted(slices.Values(c.desired(p)))
		for name, n := range c.nodes {
			if n.down {
				continue
			}
			holding, ready := n.node.Holding()
			mine := slices.Contains(want, name)
			assert.Equal(t, mine, slices.Contains(holding, p), "%s consumes partition %d", name, p)
			assert.Equal(t, mine, slices.Contains(ready, p), "%s is caught up on partition %d", name, p)
			assert.Equal(t, want, c.owners(name, p), "owners of partition %d as %s sees them", p, name)
		}
	}
}

// A node that joins takes over the partitions it now ranks among the
// first copies for, and only those. The nodes it replaces keep
// consuming and answering for them until it has caught up; queries go
// to it only then; then they stop and delete their consumers.
func TestRebalanceOnJoinHandsOverAfterCatchUp(t *testing.T) {
	c := newTestCluster(t, 12, 2)
	c.add("node-a", 0)
	c.add("node-b", 0)
	c.add("node-c", 0)
	c.settle()
	requireLayout(t, c)
	before := map[int][]string{}
	for p := range c.partitions {
		before[p] = c.desired(p)
	}

	d := c.add("node-d", 1000) // starts behind
	c.settle()
	var moved []int
	for p := range c.partitions {
		after := c.desired(p)
		if !slices.Contains(after, "node-d") {
			assert.Equal(t, before[p], after, "partition %d moved without the new node", p)
			continue
		}
		moved = append(moved, p)
		holding, ready := d.node.Holding()
		assert.Contains(t, holding, p, "the new owner consumes partition %d", p)
		assert.NotContains(t, ready, p, "the new owner is not caught up on partition %d", p)
		for _, name := range []string{"node-a", "node-b", "node-c", "node-d"} {
			assert.Equal(t, slices.Sorted(slices.Values(before[p])), c.owners(name, p),
				"partition %d is answered by its old owners only until the new one caught up (%s's view)", p, name)
		}
		for _, old := range before[p] {
			h, r := c.nodes[old].node.Holding()
			assert.Contains(t, h, p, "%s still consumes partition %d", old, p)
			assert.Contains(t, r, p, "%s still answers for partition %d", old, p)
		}
	}
	require.NotEmpty(t, moved, "a fourth node takes some partitions")
	require.Less(t, len(moved), c.partitions, "a fourth node does not take every partition")

	d.consumers.catchUpAll()
	c.settle()
	requireLayout(t, c)
	for p := range c.partitions {
		for _, old := range before[p] {
			n := c.nodes[old]
			if slices.Contains(c.desired(p), old) {
				assert.Equal(t, 1, n.consumers.starts(p), "%s kept its consumer of partition %d", old, p)
				assert.NotContains(t, n.consumers.removed, p)
				continue
			}
			assert.Contains(t, n.consumers.removed, p, "%s deleted its consumer of partition %d, handed over", old, p)
			select {
			case <-n.consumers.last(p).stopped:
			default:
				t.Errorf("%s's consumer of partition %d still runs", old, p)
			}
		}
	}
}

// When a node stops renewing its lease (a crash), the others take its
// partitions over once the lease is older than the TTL, not before;
// the new owners answer for them once caught up.
func TestTakeOverAfterLeaseExpires(t *testing.T) {
	c := newTestCluster(t, 12, 1)
	c.add("node-a", 0)
	b := c.add("node-b", 0)
	c.settle()
	requireLayout(t, c)
	_, bReady := b.node.Holding()
	require.NotEmpty(t, bReady)

	c.crash("node-b")
	a := c.nodes["node-a"]
	a.consumers.lag = 50
	// Renewals every third of the TTL: until the TTL has passed, b's
	// lease stands and its partitions stay its own.
	for range 2 {
		c.clock.Advance(c.ttl / 3)
		c.round()
		for _, p := range bReady {
			holding, _ := a.node.Holding()
			assert.NotContains(t, holding, p, "partition %d taken over before the lease expired", p)
			assert.Equal(t, []string{"node-b"}, c.owners("node-a", p))
		}
	}
	c.clock.Advance(c.ttl / 3)
	c.round()
	holding, ready := a.node.Holding()
	for _, p := range bReady {
		assert.Contains(t, holding, p, "partition %d taken over once the lease expired", p)
		assert.NotContains(t, ready, p, "partition %d not answered before the catch-up", p)
		assert.Empty(t, c.owners("node-a", p), "no caught-up owner of partition %d yet", p)
	}
	a.consumers.catchUpAll()
	c.settle()
	requireLayout(t, c)
}

// A new consumer answers for its partition only once it has settled
// what the stream held when it started; until then the node publishes
// it as held, not ready, with its lag.
func TestCatchUpBeforeServing(t *testing.T) {
	c := newTestCluster(t, 2, 1)
	a := c.add("node-a", 70)
	c.settle()
	holding, ready := a.node.Holding()
	assert.Equal(t, []int{0, 1}, holding)
	assert.Empty(t, ready)
	assert.Empty(t, c.owners("node-a", 0))
	require.NoError(t, a.node.Ready(), "a node catching up is ready: it routes queries elsewhere")
	l := a.members.Nodes()[0]
	assert.Equal(t, []int{0, 1}, l.Holding)
	assert.Equal(t, uint64(140), l.Lag)
	assert.Empty(t, l.Ready)

	// Past the start point with messages still pending: caught up.
	cons := a.consumers.last(0)
	cons.mu.Lock()
	cons.passed = true
	cons.mu.Unlock()
	c.round()
	_, ready = a.node.Holding()
	assert.Equal(t, []int{0}, ready)
	assert.Equal(t, []string{"node-a"}, c.owners("node-a", 0))
	assert.Empty(t, c.owners("node-a", 1))
}

// Step asks the server for each consumer's backlog without holding the
// node's lock: /readyz and the status answer while a call hangs.
func TestNoLockAcrossServerCalls(t *testing.T) {
	c := newTestCluster(t, 1, 1)
	a := c.add("node-a", 10)
	c.settle()
	cons := a.consumers.last(0)
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	cons.mu.Lock()
	cons.gate, cons.entered = gate, entered
	cons.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.node.Step(context.Background())
	}()
	<-entered // Step is inside Backlog, waiting at the gate
	require.True(t, a.node.mu.TryLock(), "Step holds the lock across a call to the server")
	a.node.mu.Unlock()
	require.NoError(t, a.node.Ready())
	holding, _ := a.node.Holding()
	assert.Equal(t, []int{0}, holding)
	assert.Len(t, a.node.Consumers(), 1)
	close(gate)
	<-done
}

// Ready reports a lease that was not renewed for the TTL: the other
// nodes no longer count this one.
func TestReadyNeedsTheLease(t *testing.T) {
	c := newTestCluster(t, 1, 1)
	a := c.add("node-a", 0)
	c.settle()
	require.NoError(t, a.node.Ready())
	c.leases.failPuts("nodes.node-a", errFakeServer)
	c.clock.Advance(c.ttl / 3)
	c.round()
	require.NoError(t, a.node.Ready(), "one failed renewal: the lease still stands")
	c.clock.Advance(c.ttl)
	c.round()
	err := a.node.Ready()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lease")
	assert.ErrorIs(t, err, errFakeServer)
}

// everywhere is the query router's drop on every node, checking that
// the drop was recorded before it went round.
type everywhere struct {
	t     *testing.T
	c     *testCluster
	calls int
}

func (e *everywhere) DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error) {
	e.calls++
	// Recorded, not yet gone round: no node applies it yet.
	_, ok := e.c.nodes["node-b"].members.DroppedAt(day)
	assert.False(e.t, ok, "node-b has not read the drops since")
	for _, n := range e.c.nodes {
		if !n.down {
			if _, err := n.store.DropTable(ctx, day); err != nil {
				return buckets.TableDrop{}, err
			}
		}
	}
	return buckets.TableDrop{Day: day, Readings: 20}, nil
}

func (e *everywhere) DeleteDevice(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error) {
	e.calls++
	// Recorded, not yet gone round: no node applies it yet.
	_, ok := e.c.nodes["node-b"].members.DeletedAt(dev)
	assert.False(e.t, ok, "node-b has not read the deletes since")
	found := false
	for _, n := range e.c.nodes {
		if !n.down {
			_, err := n.store.DeleteDeviceAt(ctx, dev, time.Now())
			if errors.Is(err, buckets.ErrNotFound) {
				continue
			}
			if err != nil {
				return buckets.DeviceDelete{}, err
			}
			found = true
		}
	}
	if !found {
		return buckets.DeviceDelete{Device: dev, Readings: -1}, buckets.ErrNotFound
	}
	return buckets.DeviceDelete{Device: dev, Readings: 5}, nil
}

// A device deleted through one node is deleted on every live node and
// recorded; a node that was down deletes it when it is back, once; the
// partition consumers' tombstones see the cluster-wide delete.
func TestDeviceDeleteReachesANodeThatWasDown(t *testing.T) {
	c := newTestCluster(t, 2, 1)
	a := c.add("node-a", 0)
	b := c.add("node-b", 0)
	for _, n := range []*testNode{a, b} {
		n.store.devices = map[buckets.DeviceID]bool{"dev-1": true, "dev-2": true}
	}
	e := &everywhere{t: t, c: c}
	a.node.cfg.Everywhere = e
	c.settle()

	b.down = true
	start := time.Now()
	d, err := a.node.DeleteDevice(context.Background(), "dev-1")
	require.NoError(t, err)
	assert.Equal(t, int64(5), d.Readings)
	assert.False(t, a.store.hasDevice("dev-1"))
	require.True(t, b.store.hasDevice("dev-1"))
	at, ok := a.members.DeletedAt("dev-1")
	require.True(t, ok)
	assert.False(t, at.Before(start) || at.After(time.Now()), "stamped with the wall clock: %s", at)

	b.down = false
	c.clock.Advance(10 * time.Second) // b reads the drops and deletes again
	c.round()
	assert.False(t, b.store.hasDevice("dev-1"), "deleted when back")
	assert.True(t, b.store.hasDevice("dev-2"), "the other device stays")
	own, ok := b.store.DeletedAt("dev-1")
	require.True(t, ok)
	assert.True(t, at.Equal(own), "the tombstone at the cluster-wide time, so later messages are written")
	b.store.devices["dev-1"] = true // published again after the delete
	c.clock.Advance(10 * time.Second)
	c.round()
	assert.True(t, b.store.hasDevice("dev-1"), "its own delete is as recent: what came since stays")
	assert.Equal(t, 1, b.store.deletes)

	ts := Tombstones{Local: holdStore{b.store}, Cluster: b.members}
	got, ok := ts.DeletedAt("dev-1")
	require.True(t, ok)
	assert.True(t, at.Equal(got), "b recorded the cluster-wide time: %s", got)
	_, ok = ts.DeletedAt("dev-2")
	assert.False(t, ok)

	// A node that joins later records the tombstone at the cluster-wide
	// time before it consumes, holding nothing of the device.
	j := c.add("node-c", 0)
	c.round()
	own, ok = j.store.DeletedAt("dev-1")
	require.True(t, ok)
	assert.True(t, at.Equal(own))
	assert.Zero(t, j.store.deletes)

	_, err = a.node.DeleteDevice(context.Background(), "nosuch")
	assert.ErrorIs(t, err, buckets.ErrNotFound)
}

func TestTombstonesTakeTheLaterDelete(t *testing.T) {
	early, late := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	store := func(at time.Time) *fakeStore {
		s := &fakeStore{}
		if !at.IsZero() {
			s.deleted = map[buckets.DeviceID]time.Time{"d": at}
		}
		return s
	}
	for _, tc := range []struct {
		name         string
		local, group time.Time
		want         time.Time
	}{
		{"neither", time.Time{}, time.Time{}, time.Time{}},
		{"local only", early, time.Time{}, early},
		{"cluster only", time.Time{}, late, late},
		{"cluster later", early, late, late},
		{"local later", late, early, late},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := Tombstones{Local: holdStore{store(tc.local)}, Cluster: deletesOnly{store(tc.group)}}
			got, ok := ts.DeletedAt("d")
			assert.Equal(t, !tc.want.IsZero(), ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

// deletesOnly is the cluster-wide record of a fakeStore's deletes.
type deletesOnly struct{ *fakeStore }

// A day dropped through one node is dropped on every live node and
// recorded; a node that was down drops it when it is back; a node
// whose own drop is as recent is left alone.
func TestDropReachesANodeThatWasDown(t *testing.T) {
	c := newTestCluster(t, 2, 1)
	a := c.add("node-a", 0)
	b := c.add("node-b", 0)
	day := buckets.DayOfTime(c.clock.Now().Add(-48 * time.Hour))
	for _, n := range []*testNode{a, b} {
		n.store.days[day] = true
	}
	e := &everywhere{t: t, c: c}
	a.node.cfg.Everywhere = e
	c.settle()

	b.down = true // unreachable: the drop goes round without it
	d, err := a.node.DropTable(context.Background(), day)
	require.NoError(t, err)
	assert.Equal(t, 1, e.calls)
	assert.Equal(t, int64(20), d.Readings)
	assert.False(t, a.store.has(day))
	require.True(t, b.store.has(day))
	at, ok := a.members.DroppedAt(day)
	require.True(t, ok)
	assert.Equal(t, c.clock.Now(), at)

	b.down = false
	c.clock.Advance(10 * time.Second) // b reads the drops again
	c.round()
	assert.False(t, b.store.has(day), "the node that was away dropped the day")
	require.Len(t, b.dropped, 1)
	assert.Equal(t, day, b.dropped[0].Day)
	assert.Empty(t, a.dropped, "a dropped the day through the DELETE, not as one missed")

	// A later record of the same day does not drop again what the node
	// dropped itself since.
	b.store.days[day] = true
	b.store.dropped[day] = c.clock.Now()
	require.NoError(t, a.members.RecordDrop(context.Background(), day, c.clock.Now().Add(-DropSkew/2), true))
	c.clock.Advance(10 * time.Second)
	c.round()
	assert.True(t, b.store.has(day), "its own drop is as recent: the day written since stays")
}

func TestTombstonesTakeTheLaterDrop(t *testing.T) {
	day := buckets.DayOfTime(time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC))
	early, late := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	at := func(m map[buckets.Day]time.Time) *fakeStore { return &fakeStore{dropped: m} }
	for _, tc := range []struct {
		name         string
		local, group map[buckets.Day]time.Time
		want         time.Time
		ok           bool
	}{
		{"neither", nil, nil, time.Time{}, false},
		{"local only", map[buckets.Day]time.Time{day: early}, nil, early, true},
		{"cluster only", nil, map[buckets.Day]time.Time{day: late}, late, true},
		{"cluster later", map[buckets.Day]time.Time{day: early}, map[buckets.Day]time.Time{day: late}, late, true},
		{"local later", map[buckets.Day]time.Time{day: late}, map[buckets.Day]time.Time{day: early}, late, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := Tombstones{Local: holdStore{at(tc.local)}, Cluster: at(tc.group)}
			got, ok := ts.DroppedAt(day)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

// holdStore adds HoldDrops to a fakeStore.
type holdStore struct{ *fakeStore }

func (holdStore) HoldDrops() func() { return func() {} }

func TestPositionsPerPartition(t *testing.T) {
	st := &positionStore{m: map[string]buckets.StreamPosition{}}
	p3 := Positions{Store: st, Partition: 3}
	require.NoError(t, p3.SavePosition(context.Background(), buckets.StreamPosition{Stream: "TELEMETRY", Seq: 42}))
	assert.Contains(t, st.m, "TELEMETRY/p3")
	pos, ok, err := p3.LoadPosition(context.Background(), "TELEMETRY")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, buckets.StreamPosition{Stream: "TELEMETRY", Seq: 42}, pos)
	_, ok, err = Positions{Store: st, Partition: 4}.LoadPosition(context.Background(), "TELEMETRY")
	require.NoError(t, err)
	assert.False(t, ok)
}

type positionStore struct {
	m map[string]buckets.StreamPosition
}

func (s *positionStore) LoadPosition(_ context.Context, stream string) (buckets.StreamPosition, bool, error) {
	p, ok := s.m[stream]
	return p, ok, nil
}

func (s *positionStore) SavePosition(_ context.Context, p buckets.StreamPosition) error {
	s.m[p.Stream] = p
	return nil
}

// A caught-up owner whose consumer stops settling what the stream holds
// (its deliveries lost on the way, its NATS server cut off or paused)
// stops answering for the partition once it trails the stream by more
// than MaxReadLag and another owner answers it without trailing, and
// answers again once it is back: a query never gets a copy missing
// readings the stream acked long before it while a fresher one answers.
func TestStaleOwnerWithdrawsFromQueries(t *testing.T) {
	c := newTestCluster(t, 1, 2)
	a := c.add("node-a", 0)
	b := c.add("node-b", 0)
	c.settle()
	require.Equal(t, []string{"node-a", "node-b"}, c.owners("node-b", 0))
	ca, cb := a.consumers.last(0), b.consumers.last(0)
	ca.setPosition(100, 100, nil)
	cb.setPosition(100, 100, nil)
	c.round()

	// node-a's consumer is stuck at 100 while the stream moves on.
	for head := uint64(110); head <= 200; head += 10 {
		ca.setPosition(100, head, nil)
		cb.setPosition(head, head, nil)
		c.clock.Advance(time.Second)
		c.round()
		if c.clock.now.Sub(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)) <= DefaultMaxReadLag {
			assert.Equal(t, []string{"node-a", "node-b"}, c.owners("node-b", 0), "within the bound")
		}
	}
	c.clock.Advance(2 * time.Second)
	c.round() // node-a trails; node-b's lease it read was written before that
	assert.Equal(t, []string{"node-a", "node-b"}, c.owners("node-a", 0), "withdrawn before a lease of node-b written after it began to trail")
	c.clock.Advance(time.Second)
	c.round() // node-b writes its next lease
	c.round() // node-a reads it: it withdraws
	c.round() // node-b reads node-a's lease
	assert.Equal(t, []string{"node-b"}, c.owners("node-b", 0), "stale owner still asked, as node-b sees it")
	assert.Equal(t, []string{"node-b"}, c.owners("node-a", 0), "stale owner still asked, as node-a sees it")
	holding, ready := a.node.Holding()
	assert.Equal(t, []int{0}, holding, "a stale owner keeps consuming")
	assert.Empty(t, ready)

	// Caught up again: it answers again.
	ca.setPosition(200, 200, nil)
	c.round()
	c.round()
	assert.Equal(t, []string{"node-a", "node-b"}, c.owners("node-b", 0))

	// A server that cannot be asked for longer than the bound: stale too.
	ca.setPosition(0, 0, errFakeServer)
	for range 13 {
		c.clock.Advance(time.Second)
		c.round()
	}
	assert.Equal(t, []string{"node-b"}, c.owners("node-a", 0))

	// Both stale: no owner answers without trailing, so both answer
	// with what they have, as trailing.
	cb.setPosition(200, 300, nil)
	for range 12 {
		c.clock.Advance(time.Second)
		c.round()
	}
	c.round()
	assert.Equal(t, []string{"node-a", "node-b"}, c.owners("node-a", 0))
	assert.Equal(t, []string{"node-a", "node-b"}, c.owners("node-b", 0))
	for _, l := range a.members.Nodes() {
		assert.Equal(t, []int{0}, l.Trailing, "%s publishes partition 0 as trailing", l.Node)
	}
}

// twoCaughtUpOwners is a cluster of one partition and two nodes, both
// owning it, their consumers caught up at position 100.
func twoCaughtUpOwners(t *testing.T) (c *testCluster, a, b *testNode, ca, cb *fakeConsumer) {
	c = newTestCluster(t, 1, 2)
	a, b = c.add("node-a", 0), c.add("node-b", 0)
	c.settle()
	ca, cb = a.consumers.last(0), b.consumers.last(0)
	ca.setPosition(100, 100, nil)
	cb.setPosition(100, 100, nil)
	c.round()
	return c, a, b, ca, cb
}

// When a NATS server goes away, every owner's consumer of a partition
// may stand still at once (the deliveries and acks on their way to it
// lost): both owners trail the stream past MaxReadLag in the same
// moment. Neither may withdraw the partition then, or no node answers
// for it at all; each answers what it has, as trailing. Once one is
// back within the bound, the other, still trailing, withdraws; an owner
// whose own lease lapsed withdraws whatever the others publish.
func TestOwnersTrailingTogetherKeepAnswering(t *testing.T) {
	c, a, b, ca, cb := twoCaughtUpOwners(t)
	for head := uint64(110); head <= 300; head += 10 {
		ca.setPosition(100, head, nil)
		cb.setPosition(100, head, nil)
		c.clock.Advance(time.Second)
		c.round()
		for _, from := range []string{"node-a", "node-b"} {
			require.NotEmpty(t, c.owners(from, 0), "no owner answers for partition 0 as %s sees it (%d s stuck)", from, (head-100)/10)
		}
		require.True(t, a.node.Serves(0) || b.node.Serves(0), "neither owner serves partition 0 (%d s stuck)", (head-100)/10)
	}
	assert.True(t, a.node.Serves(0))
	assert.True(t, b.node.Serves(0))
	assert.True(t, a.node.Trailing(0), "node-a answers from a trailing copy (its answers are marked partial)")
	assert.True(t, b.node.Trailing(0))
	for _, l := range a.members.Nodes() {
		assert.Equal(t, []int{0}, l.Trailing, "%s publishes partition 0 as trailing", l.Node)
	}
	// The router asks an owner that does not trail first.
	ca.setPosition(300, 300, nil)
	c.round()
	c.clock.Advance(time.Second)
	c.round()
	c.round()
	assert.False(t, b.node.Serves(0), "node-b still serves while node-a answers without trailing")
	assert.False(t, b.node.Trailing(0), "a partition withdrawn is not answered at all")
	assert.True(t, a.node.Serves(0))
	assert.False(t, a.node.Trailing(0), "node-a is back within the bound")
	assert.Equal(t, []string{"node-a"}, c.owners("node-b", 0))
	assert.Equal(t, []string{"node-a"}, c.owners("node-a", 0))

	// node-a trails again, alone, and its lease lapses (its server
	// cut off): it withdraws although nobody else answers.
	cb.setPosition(300, 300, nil)
	c.round()
	c.clock.Advance(time.Second)
	c.round()
	require.True(t, b.node.Serves(0))
	c.leases.failPuts("nodes.node-a", errFakeServer)
	for head := uint64(310); head <= 450; head += 10 {
		ca.setPosition(300, head, errFakeServer)
		cb.setPosition(head, head, nil)
		c.clock.Advance(time.Second)
		c.round()
	}
	assert.Error(t, a.members.LeaseErr())
	assert.False(t, a.node.Serves(0), "a node whose lease lapsed serves a partition it trails")
}

// Nodes whose clocks are a minute ahead of or behind the servers' see
// the same live nodes as the others and own the same partitions: a
// lease's age is measured on the server's clock. A node a minute ahead
// would otherwise see every other lease as dead and take every
// partition; one a minute behind would keep a dead node's lease alive
// for a minute.
func TestClockOffsetDoesNotMoveOwnership(t *testing.T) {
	c := newTestCluster(t, 6, 2)
	c.addSkewed("node-a", 0, time.Minute)
	b := c.addSkewed("node-b", 0, -time.Minute)
	c.add("node-c", 0)
	c.settle()
	requireLayout(t, c)
	for name, n := range c.nodes {
		assert.Len(t, n.members.Nodes(), 3, "%s sees every node", name)
		for _, l := range n.members.Nodes() {
			// Renewed is on the viewing node's clock.
			assert.WithinDuration(t, n.members.Nodes()[0].Renewed, l.Renewed, c.ttl, "%s's view of %s", name, l.Node)
		}
	}
	var share []int
	for p := range c.partitions {
		if slices.Contains(c.desired(p), "node-a") {
			share = append(share, p)
		}
	}
	holding, _ := c.nodes["node-a"].node.Holding()
	assert.Equal(t, share, holding, "node-a, a minute ahead, holds its share only")

	// node-c dies: node-b, a minute behind, sees its lease lapse after
	// the TTL like everyone else.
	c.crash("node-c")
	c.clock.Advance(c.ttl + time.Second)
	c.settle()
	assert.Len(t, b.members.Nodes(), 2, "node-b still counts the dead node")
	requireLayout(t, c)
}

// Serves answers from the node's own state at once, while the leases
// another node read still list it: a node that hands a partition over
// stops serving it in the step that stops its consumer, and one that
// trails its stream in the step that withdraws it, before any other
// node reads its next lease. The router asks Serves, not the leases,
// before it answers from this node's copy.
func TestServesFollowsTheNodesOwnState(t *testing.T) {
	t.Run("hand-over", func(t *testing.T) {
		c := newTestCluster(t, 12, 2)
		for _, name := range []string{"node-a", "node-b", "node-c"} {
			c.add(name, 0)
		}
		c.settle()
		before := map[int][]string{}
		for p := range c.partitions {
			before[p] = c.desired(p)
			for _, name := range before[p] {
				assert.True(t, c.nodes[name].node.Serves(p), "%s serves partition %d", name, p)
			}
		}
		d := c.add("node-d", 1000)
		c.settle()
		d.consumers.catchUpAll()
		seen := 0
		for range 4 {
			c.round()
			for p := range c.partitions {
				for _, old := range before[p] {
					if slices.Contains(c.desired(p), old) || c.nodes[old].node.Serves(p) {
						continue
					}
					if slices.Contains(c.owners("node-d", p), old) {
						seen++ // node-d's view is a lease behind
					}
				}
			}
		}
		assert.Positive(t, seen, "a node that handed a partition over is still an owner in another's view for a while")
		requireLayout(t, c)
		for p := range c.partitions {
			for name, n := range c.nodes {
				assert.Equal(t, slices.Contains(c.desired(p), name), n.node.Serves(p), "%s serves partition %d", name, p)
			}
		}
	})
	t.Run("trailing its stream", func(t *testing.T) {
		c, a, b, ca, cb := twoCaughtUpOwners(t)
		require.True(t, a.node.Serves(0))
		for head := uint64(110); a.node.Serves(0); head += 10 {
			require.Less(t, head, uint64(1000), "node-a never stops serving")
			ca.setPosition(100, head, nil) // stuck at 100
			cb.setPosition(head, head, nil)
			c.clock.Advance(time.Second)
			c.round()
		}
		assert.Contains(t, c.owners("node-b", 0), "node-a", "node-b read node-a's lease before node-a withdrew")
		assert.True(t, b.node.Serves(0))
		c.round()
		assert.NotContains(t, c.owners("node-b", 0), "node-a")
	})
}

// A node whose process was paused (SIGSTOP) past MaxReadLag answers its
// first queries on waking before it steps again: whether its copy
// trails is judged when asked, so those answers are marked partial
// rather than passed off as complete.
func TestTrailingIsJudgedWhenAsked(t *testing.T) {
	c, a, _, _, _ := twoCaughtUpOwners(t)
	require.True(t, a.node.Serves(0))
	require.False(t, a.node.Trailing(0))
	c.clock.Advance(DefaultMaxReadLag + time.Second) // paused: no step ran
	assert.True(t, a.node.Serves(0))
	assert.True(t, a.node.Trailing(0), "a copy last known settled %s ago is answered as complete", DefaultMaxReadLag+time.Second)
}

// A consumer whose backlog reads empty has caught up only as far as the
// server that answered knows: a consumer leader whose copy of the
// stream lags (its server just back from a power cut) reports nothing
// pending while the stream's leader holds more. The partition counts
// as fresh only once its ack floor passed the stream's last message.
func TestCaughtUpIsNotFreshUntilSettled(t *testing.T) {
	c := newTestCluster(t, 1, 2)
	c.add("node-a", 0)
	c.settle()
	b := c.add("node-b", 1000)
	c.settle()
	cb := b.consumers.last(0)
	require.NotNil(t, cb)
	cb.setPosition(50, 100, nil) // the stream's leader holds 100
	for range DefaultMaxReadLag/time.Second + 1 {
		c.clock.Advance(time.Second) // catching up, as the leases renew
		c.round()
	}
	require.False(t, b.node.Serves(0))
	cb.catchUp() // a lagging consumer leader: nothing pending
	for range 3 {
		c.round()
		assert.False(t, b.node.Serves(0) && !b.node.Trailing(0), "node-b answers as complete from a copy missing messages 51-100")
	}
	cb.setPosition(100, 100, nil)
	c.round()
	c.round()
	assert.True(t, b.node.Serves(0))
	assert.False(t, b.node.Trailing(0), "settled: node-b answers as complete")
}

// A consumer whose leader serves a copy of the stream lacking what the
// stream's leader holds delivers nothing (nothing pending), and its ack
// floor stays below the stream's last message: after stalledAfter
// without progress the node asks the servers to move the consumer's
// leader, and again if it stays stuck; one that makes progress, or has
// messages pending, is left alone.
func TestStalledConsumerHasItsLeaderMoved(t *testing.T) {
	c := newTestCluster(t, 1, 1)
	a := c.add("node-a", 0)
	c.settle()
	ca := a.consumers.last(0)
	require.NotNil(t, ca)
	ca.setPosition(100, 100, nil)
	c.round()
	require.True(t, a.node.Serves(0))

	ca.setPosition(100, 140, nil) // nothing pending, 40 more in the stream
	steps := int(stalledAfter/time.Second) - 1
	for range steps {
		c.clock.Advance(time.Second)
		c.round()
	}
	assert.Zero(t, ca.stepDowns(), "moved before stalledAfter")
	for range 2 {
		c.clock.Advance(time.Second)
		c.round()
	}
	require.Eventually(t, func() bool { return ca.stepDowns() == 1 }, 5*time.Second, 10*time.Millisecond)

	// Progress (a consumer working through a backlog) is not a stall.
	for i := range 2 * steps {
		ca.setPosition(100+uint64(i), 200, nil)
		c.clock.Advance(time.Second)
		c.round()
	}
	// Nor is a backlog the server reports.
	ca.mu.Lock()
	ca.pending = 5
	ca.mu.Unlock()
	for range 2 * steps {
		c.clock.Advance(time.Second)
		c.round()
	}
	assert.Equal(t, 1, ca.stepDowns(), "moved while making progress or with messages pending")
}
