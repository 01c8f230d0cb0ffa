package alerting

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTestBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true})
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(ns.Shutdown)
	require.True(t, ns.ReadyForConnections(10*time.Second))
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: StateBucket})
	require.NoError(t, err)
	return kv
}

// fakeCluster is a node's view of the cluster: the nodes it sees, each
// with its last renewal, and whether its own lease is held.
type fakeCluster struct {
	mu    sync.Mutex
	nodes map[string]time.Time
	own   error
}

func (f *fakeCluster) set(nodes map[string]time.Time, own error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes, f.own = nodes, own
}

// cluster is self's view; serverNow is the servers' clock (nil: the
// node's own).
func (f *fakeCluster) cluster(self string, serverNow func() time.Time) Cluster {
	return Cluster{Self: self, LeaseTTL: 2 * time.Second, ServerNow: serverNow,
		Nodes: func() map[string]time.Time {
			f.mu.Lock()
			defer f.mu.Unlock()
			out := map[string]time.Time{}
			for n, t := range f.nodes {
				out[n] = t
			}
			return out
		},
		LeaseErr: func() error {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.own
		}}
}

// TestGroupLeases: two nodes whose views of the cluster differ (one has
// just joined and the other has not seen it yet) never both hold a
// group; the preferred node takes it once the other lets it go or its
// lease lapses; a node whose own lease lapsed holds nothing.
func TestGroupLeases(t *testing.T) {
	kv := newTestBucket(t)
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The servers' clock (the entries' timestamps) moves with the test's.
	start := now
	serverNow := func() time.Time { return time.Now().Add(now.Sub(start)) }
	var va, vb fakeCluster
	a := newGroupLeases(kv, va.cluster("a", serverNow), clock, log)
	b := newGroupLeases(kv, vb.cluster("b", serverNow), clock, log)
	// Groups spread over the nodes.
	spread := map[string]int{}
	for i := range 300 {
		spread[preferred(map[string]bool{"node-0": true, "node-1": true, "node-2": true}, "group-"+strconv.Itoa(i))]++
	}
	for n, c := range spread {
		assert.InDelta(t, 100, c, 30, "%s is preferred for %d of 300 groups", n, c)
	}
	// A group that b ranks above a.
	group := ""
	for _, g := range []string{"g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"} {
		if preferred(map[string]bool{"a": true, "b": true}, g) == "b" {
			group = g
			break
		}
	}
	require.NotEmpty(t, group)

	// a alone holds it.
	va.set(map[string]time.Time{"a": now}, nil)
	require.True(t, a.Held(group))
	require.True(t, a.Held(group), "renewed")

	// b joins and sees a; a has not seen b yet: b waits.
	vb.set(map[string]time.Time{"a": now, "b": now}, nil)
	assert.False(t, b.Held(group), "b took the group from a live holder")
	assert.True(t, a.Held(group))

	// a sees b: it lets the group go, and b takes it.
	va.set(map[string]time.Time{"a": now, "b": now}, nil)
	assert.False(t, a.Held(group))
	assert.True(t, b.Held(group))
	assert.False(t, a.Held(group))

	// b's lease lapses (it is killed): a takes the group at once.
	renewed := now
	now = now.Add(2 * time.Second)
	va.set(map[string]time.Time{"a": now, "b": renewed}, nil)
	assert.True(t, a.Held(group), "a did not take the group of a node whose lease lapsed")

	// b comes back while a still holds it in b's view: b's entry was
	// taken, so b does not evaluate until a lets go.
	vb.set(map[string]time.Time{"a": now, "b": now}, nil)
	assert.False(t, b.Held(group), "b evaluates with a")
	va.set(map[string]time.Time{"a": now, "b": now}, nil)
	assert.False(t, a.Held(group))
	assert.True(t, b.Held(group))

	// b's own lease lapses (it lost the cluster): it holds nothing.
	vb.set(map[string]time.Time{"a": now, "b": now}, errors.New("lease not renewed"))
	assert.False(t, b.Held(group))

	// A clean stop lets the groups go.
	vb.set(map[string]time.Time{"a": now, "b": now}, nil)
	require.True(t, b.Held(group))
	b.ReleaseAll()
	_, err := kv.Get(context.Background(), leaseKey(group))
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound)
}

// TestGroupLeasesUnseenHolder: two nodes that have just started, each
// seeing only itself, both rank first for a group. The second must not
// take the entry the first wrote in the same interval; it takes it once
// the entry is a lease TTL old on the servers' clock.
func TestGroupLeasesUnseenHolder(t *testing.T) {
	kv := newTestBucket(t)
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	start := now
	clock := func() time.Time { return now }
	serverNow := func() time.Time { return time.Now().Add(now.Sub(start)) }
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var va, vb fakeCluster
	va.set(map[string]time.Time{"a": now}, nil)
	vb.set(map[string]time.Time{"b": now}, nil)
	a := newGroupLeases(kv, va.cluster("a", serverNow), clock, log)
	b := newGroupLeases(kv, vb.cluster("b", serverNow), clock, log)

	require.True(t, a.Held("g"))
	assert.False(t, b.Held("g"), "b took the group a evaluated in this interval")
	assert.True(t, a.Held("g"))

	// a stops renewing (it was killed before b ever saw it).
	now = now.Add(2 * time.Second)
	assert.True(t, b.Held("g"), "b did not take the group of a holder silent for a lease TTL")
}
