package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/ownership"
)

// fakeClock is the time every node of a test cluster reads.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fakeKV is a key-value bucket in memory whose entries are stamped
// with the fake clock (ownership.KV).
type fakeKV struct {
	clock *fakeClock
	mu    sync.Mutex
	rev   uint64
	m     map[string]kvEntry
	fail  map[string]error // key → error of its Put
}

type kvEntry struct {
	key     string
	value   []byte
	rev     uint64
	created time.Time
	op      jetstream.KeyValueOp
}

func (e kvEntry) Bucket() string                  { return "fake" }
func (e kvEntry) Key() string                     { return e.key }
func (e kvEntry) Value() []byte                   { return e.value }
func (e kvEntry) Revision() uint64                { return e.rev }
func (e kvEntry) Created() time.Time              { return e.created }
func (e kvEntry) Delta() uint64                   { return 0 }
func (e kvEntry) Operation() jetstream.KeyValueOp { return e.op }

func newFakeKV(clock *fakeClock) *fakeKV {
	return &fakeKV{clock: clock, m: map[string]kvEntry{}, fail: map[string]error{}}
}

func (kv *fakeKV) Put(_ context.Context, key string, value []byte) (uint64, error) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	if err := kv.fail[key]; err != nil {
		return 0, err
	}
	kv.rev++
	kv.m[key] = kvEntry{key: key, value: slices.Clone(value), rev: kv.rev, created: kv.clock.Now(), op: jetstream.KeyValuePut}
	return kv.rev, nil
}

func (kv *fakeKV) Get(_ context.Context, key string) (jetstream.KeyValueEntry, error) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	e, ok := kv.m[key]
	if !ok || e.op != jetstream.KeyValuePut {
		return nil, jetstream.ErrKeyNotFound
	}
	return e, nil
}

func (kv *fakeKV) Keys(context.Context, ...jetstream.WatchOpt) ([]string, error) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	var keys []string
	for k, e := range kv.m {
		if e.op == jetstream.KeyValuePut {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, jetstream.ErrNoKeysFound
	}
	return keys, nil
}

func (kv *fakeKV) Delete(_ context.Context, key string, _ ...jetstream.KVDeleteOpt) error {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	kv.rev++
	kv.m[key] = kvEntry{key: key, rev: kv.rev, created: kv.clock.Now(), op: jetstream.KeyValueDelete}
	return nil
}

func (kv *fakeKV) failPuts(key string, err error) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	kv.fail[key] = err
}

// fakeConsumer is a partition consumer whose backlog the test sets.
type fakeConsumer struct {
	mu      sync.Mutex
	pending uint64
	passed  bool
	applied uint64        // Position's answer: the ack floor,
	head    uint64        // the partition's last message,
	posErr  error         // or this error
	gate    chan struct{} // when set, Backlog waits for it to close
	entered chan struct{} // when set, Backlog signals it was called
	running chan struct{} // closed once Run started
	stopped chan struct{} // closed once Run returned
	stepped int           // StepDown calls
}

func newFakeConsumer(pending uint64) *fakeConsumer {
	return &fakeConsumer{pending: pending, running: make(chan struct{}), stopped: make(chan struct{})}
}

func (c *fakeConsumer) Run(ctx context.Context) error {
	close(c.running)
	<-ctx.Done()
	close(c.stopped)
	return nil
}

func (c *fakeConsumer) Ready() error { return nil }

func (c *fakeConsumer) Backlog(ctx context.Context) (uint64, bool, error) {
	c.mu.Lock()
	gate, entered := c.gate, c.entered
	c.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, false, ctx.Err()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending, c.passed, nil
}

func (c *fakeConsumer) Position(context.Context) (uint64, uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applied, c.head, c.posErr
}

func (c *fakeConsumer) StepDown(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stepped++
	return nil
}

func (c *fakeConsumer) stepDowns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stepped
}

// setPosition sets what Position answers.
func (c *fakeConsumer) setPosition(applied, head uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applied, c.head, c.posErr = applied, head, err
}

func (c *fakeConsumer) catchUp() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending, c.passed = 0, true
}

// fakeConsumers makes fakeConsumers that start behind by lag messages
// (0: caught up at once) and records every consumer made and removed.
type fakeConsumers struct {
	mu      sync.Mutex
	lag     uint64
	made    map[int][]*fakeConsumer
	removed []int
}

func (f *fakeConsumers) Consumer(p int) (Consumer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := newFakeConsumer(f.lag)
	f.made[p] = append(f.made[p], c)
	return c, nil
}

func (f *fakeConsumers) Remove(_ context.Context, p int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, p)
	return nil
}

// last is the latest consumer made for p.
func (f *fakeConsumers) last(p int) *fakeConsumer {
	f.mu.Lock()
	defer f.mu.Unlock()
	cs := f.made[p]
	if len(cs) == 0 {
		return nil
	}
	return cs[len(cs)-1]
}

func (f *fakeConsumers) starts(p int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.made[p])
}

func (f *fakeConsumers) catchUpAll() {
	f.mu.Lock()
	var all []*fakeConsumer
	for _, cs := range f.made {
		all = append(all, cs...)
	}
	f.lag = 0
	f.mu.Unlock()
	for _, c := range all {
		c.catchUp()
	}
}

// fakeStore holds days and their drops.
type fakeStore struct {
	mu      sync.Mutex
	days    map[buckets.Day]bool
	dropped map[buckets.Day]time.Time
	devices map[buckets.DeviceID]bool
	deleted map[buckets.DeviceID]time.Time
	deletes int // DeleteDevice calls that deleted
	now     func() time.Time
}

func (s *fakeStore) DroppedAt(day buckets.Day) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.dropped[day]
	return at, ok
}

func (s *fakeStore) DropTable(_ context.Context, day buckets.Day) (buckets.TableDrop, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.days[day] {
		return buckets.TableDrop{Day: day, Readings: -1}, fmt.Errorf("table %s: %w", day, buckets.ErrNotFound)
	}
	delete(s.days, day)
	s.dropped[day] = s.now()
	return buckets.TableDrop{Day: day, Readings: 10}, nil
}

func (s *fakeStore) DeletedAt(dev buckets.DeviceID) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.deleted[dev]
	return at, ok
}

func (s *fakeStore) DeleteDeviceAt(_ context.Context, dev buckets.DeviceID, at time.Time) (buckets.DeviceDelete, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deleted == nil {
		s.deleted = map[buckets.DeviceID]time.Time{}
	}
	s.deleted[dev] = at
	if !s.devices[dev] {
		return buckets.DeviceDelete{Device: dev, Readings: -1}, fmt.Errorf("device %s: %w", dev, buckets.ErrNotFound)
	}
	delete(s.devices, dev)
	s.deletes++
	return buckets.DeviceDelete{Device: dev, Deleted: at, Readings: 5}, nil
}

func (s *fakeStore) hasDevice(dev buckets.DeviceID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.devices[dev]
}

func (s *fakeStore) has(day buckets.Day) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.days[day]
}

// testCluster is nodes on one fake clock and one fake bucket pair.
type testCluster struct {
	t          *testing.T
	clock      *fakeClock
	leases     *fakeKV
	drops      *fakeKV
	partitions int
	copies     int
	ttl        time.Duration
	nodes      map[string]*testNode
}

// testNode is one node: its membership, reconcile loop and fakes.
type testNode struct {
	name      string
	members   *ownership.Membership
	node      *Node
	consumers *fakeConsumers
	store     *fakeStore
	dropped   []buckets.TableDrop // days dropped through Config.Dropped
	down      bool                // crashed: no more syncs or steps
}

func newTestCluster(t *testing.T, partitions, copies int) *testCluster {
	t.Helper()
	clock := &fakeClock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	return &testCluster{t: t, clock: clock, leases: newFakeKV(clock), drops: newFakeKV(clock),
		partitions: partitions, copies: copies, ttl: 3 * time.Second, nodes: map[string]*testNode{}}
}

// add starts a node whose consumers start lag messages behind.
func (c *testCluster) add(name string, lag uint64) *testNode {
	c.t.Helper()
	return c.addSkewed(name, lag, 0)
}

// addSkewed starts a node whose clock is off by offset from the
// bucket's (the servers').
func (c *testCluster) addSkewed(name string, lag uint64, offset time.Duration) *testNode {
	c.t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	now := func() time.Time { return c.clock.Now().Add(offset) }
	members, err := ownership.NewOn(c.leases, c.drops, ownership.Config{Node: name, URL: "http://" + name,
		Partitions: c.partitions, Copies: c.copies, LeaseTTL: c.ttl, Logger: log, Now: now})
	require.NoError(c.t, err)
	require.NoError(c.t, members.Open(context.Background()))
	n := &testNode{name: name, members: members,
		consumers: &fakeConsumers{lag: lag, made: map[int][]*fakeConsumer{}},
		store:     &fakeStore{days: map[buckets.Day]bool{}, dropped: map[buckets.Day]time.Time{}, now: now}}
	n.node, err = New(Config{Members: members, Consumers: n.consumers, Store: n.store,
		Dropped: func(_ context.Context, d buckets.TableDrop) { n.dropped = append(n.dropped, d) },
		Logger:  log, Now: now})
	require.NoError(c.t, err)
	c.t.Cleanup(func() { _ = n.node.Close(context.Background()) })
	c.nodes[name] = n
	return n
}

// round lets every live node renew and read the leases, then step.
func (c *testCluster) round() {
	ctx := context.Background()
	for _, name := range slices.Sorted(maps.Keys(c.nodes)) {
		if n := c.nodes[name]; !n.down {
			n.members.Sync(ctx)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.nodes)) {
		if n := c.nodes[name]; !n.down {
			n.node.Step(ctx)
		}
	}
}

// settle runs rounds until nothing changes any more (at most 10).
func (c *testCluster) settle() {
	prev := ""
	for range 10 {
		c.round()
		s := c.state()
		if s == prev {
			return
		}
		prev = s
	}
	c.t.Fatalf("the cluster did not settle: %s", prev)
}

// state is every live node's holding and ready partitions.
func (c *testCluster) state() string {
	out := ""
	for _, name := range slices.Sorted(maps.Keys(c.nodes)) {
		if n := c.nodes[name]; !n.down {
			h, r := n.node.Holding()
			out += fmt.Sprintf("%s holds %v ready %v; ", name, h, r)
		}
	}
	return out
}

// desired is the desired owners of p among the live nodes.
func (c *testCluster) desired(p int) []string {
	var live []string
	for name, n := range c.nodes {
		if !n.down {
			live = append(live, name)
		}
	}
	return ownership.Rank(live, p)[:min(c.copies, len(live))]
}

// owners is who answers for p as node from sees it.
func (c *testCluster) owners(from string, p int) []string {
	var out []string
	for _, o := range c.nodes[from].members.Owners(p) {
		out = append(out, o.Node)
	}
	slices.Sort(out)
	return out
}

// crash stops a node the way a killed process stops: no more renewals,
// its lease stays in the bucket until it expires.
func (c *testCluster) crash(name string) {
	n := c.nodes[name]
	n.down = true
	require.NoError(c.t, n.node.Close(context.Background()))
}

var errFakeServer = errors.New("no responders")
