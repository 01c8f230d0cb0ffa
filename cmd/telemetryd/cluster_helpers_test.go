package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// longCluster makes the cluster tests run their long variants.
func longCluster() bool { return os.Getenv("TELEMETRY_LONG") != "" }

// freePort returns a loopback port that was free a moment ago, for a
// server that must keep its port across restarts. It is taken below the
// kernel's ephemeral range (ip_local_port_range): a port from that range
// can go to any outgoing connection of the tests running alongside
// between this check and the server's listen, which made cluster starts
// fail now and then. No port is handed out twice.
func freePort(t *testing.T) int {
	t.Helper()
	low := ephemeralLow()
	for range 1000 {
		p := portsFrom + rand.IntN(low-portsFrom)
		if _, taken := handedPorts.LoadOrStore(p, true); taken {
			continue
		}
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatalf("no free port in [%d, %d)", portsFrom, low)
	return 0
}

// portsFrom is the lowest port freePort hands out.
const portsFrom = 10000

var handedPorts sync.Map // port → true: what freePort handed out

// ephemeralLow is the first port of the kernel's ephemeral range, 32768
// where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low <= portsFrom+1000 {
		return 32768
	}
	return low
}

// natsCluster is a JetStream cluster of in-process servers, each with
// its own name, store and cluster port, routed to the others on
// loopback.
type natsCluster struct {
	t       *testing.T
	opts    []*server.Options
	servers []*server.Server
}

// startNATSCluster starts n servers; edit (if any) adjusts the options
// of server i before it starts.
func startNATSCluster(t *testing.T, n int, edit ...func(i int, o *server.Options)) *natsCluster {
	t.Helper()
	c := &natsCluster{t: t}
	routePorts := make([]int, n)
	for i := range routePorts {
		routePorts[i] = freePort(t)
	}
	var routes []string
	for _, p := range routePorts {
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(p))
	}
	for i := range n {
		c.opts = append(c.opts, &server.Options{
			ServerName: fmt.Sprintf("nats-%d", i),
			Host:       "127.0.0.1", Port: freePort(t),
			JetStream: true, StoreDir: t.TempDir(), NoSigs: true,
			Cluster: server.ClusterOpts{Name: "telemetry-test", Host: "127.0.0.1", Port: routePorts[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		})
		if n == 1 { // a lone server: JetStream without a cluster
			c.opts[i].Cluster, c.opts[i].Routes = server.ClusterOpts{}, nil
		}
		for _, e := range edit {
			e(i, c.opts[i])
		}
		c.servers = append(c.servers, nil)
	}
	for i := range n {
		c.start(i)
	}
	t.Cleanup(func() {
		for i := range c.servers {
			c.stop(i)
		}
	})
	// JetStream answers once the meta group has a leader.
	nc, err := nats.Connect(c.url(0))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	waitFor(t, 100*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	}, "the JetStream cluster never elected a meta leader")
	return c
}

func (c *natsCluster) start(i int) {
	c.t.Helper()
	ns, err := server.NewServer(c.opts[i])
	require.NoError(c.t, err)
	ns.Start()
	require.True(c.t, ns.ReadyForConnections(10*time.Second))
	c.servers[i] = ns
}

func (c *natsCluster) stop(i int) {
	if ns := c.servers[i]; ns != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		c.servers[i] = nil
	}
}

func (c *natsCluster) url(i int) string {
	return "nats://127.0.0.1:" + strconv.Itoa(c.opts[i].Port)
}

// urls is every server, so a client fails over.
func (c *natsCluster) urls() string {
	var out []string
	for i := range c.opts {
		out = append(out, c.url(i))
	}
	return strings.Join(out, ",")
}

// waitFor polls cond every tick until it holds, for as long as the test
// may run (go test -timeout, less a minute for the cleanup): a cluster
// on a loaded machine converges and stores late, not never, so no fixed
// wall-clock limit decides the test. Without a deadline it waits up to
// ten minutes (a benchmark has no deadline).
func waitFor(t testing.TB, tick time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, cond, max(waitBudget(t), tick), tick, msgAndArgs...)
}

// waitBudget is how long a test may still wait: until go test's
// deadline less a minute for the cleanup, or ten minutes without one.
func waitBudget(t testing.TB) time.Duration {
	if dl, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if d, ok := dl.Deadline(); ok {
			return time.Until(d) - time.Minute
		}
	}
	return 10 * time.Minute
}

// untilDeadline is a context for a step that takes long only on a
// loaded machine (a service's start and stop, a publish's ack): it
// ends when the test may no longer wait (waitBudget).
func untilDeadline(t testing.TB) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), max(waitBudget(t), time.Second))
}

// testCursorKey is the cursor key every node of a test cluster shares.
const testCursorKey = "0123456789abcdef0123456789abcdef-cluster"

// clusterNodeConfig is the configuration of node i of a test cluster.
func clusterNodeConfig(t *testing.T, nc *natsCluster, i, partitions int) Config {
	t.Helper()
	cfg := newTestConfig(t)
	port := freePort(t)
	cfg.HTTPAddr = "127.0.0.1:" + strconv.Itoa(port)
	cfg.NATSURL = nc.url(i % len(nc.opts))
	cfg.MQTTListen = ""
	cfg.Security.CursorKey = testCursorKey
	cfg.Cluster.Partitions = partitions
	cfg.Cluster.Copies = 2
	cfg.Cluster.NodeName = fmt.Sprintf("node-%d", i)
	cfg.Cluster.AdvertiseURL = "http://" + cfg.HTTPAddr
	// Long enough that a loaded test machine does not let a lease lapse
	// (which would move partitions); the failover tests shorten it.
	cfg.Cluster.LeaseTTL = 10 * time.Second
	cfg.Cluster.StreamReplicas = len(nc.opts)
	// The one stream TELEMETRY, not the default stream per partition:
	// these servers map no partitions (streamNodeConfig and
	// startNATSCluster's setPartitionMapping set up the default).
	cfg.Cluster.PartitionStreams = false
	// A query across nodes on a loaded machine answers late, not wrong:
	// the tests check answers, not the query timeout.
	cfg.QueryTimeout = time.Minute
	require.NoError(t, cfg.Validate())
	return cfg
}

// clusterNode is one in-process telemetryd of a test cluster.
type testNode struct {
	t    *testing.T
	cfg  Config
	m    *Main
	base string
	mu   sync.Mutex
}

// startNode opens a node; the test closes it (or crashes it).
func startNode(t *testing.T, cfg Config, clock func() time.Time) *testNode {
	t.Helper()
	n := &testNode{t: t, cfg: cfg, base: "http://" + cfg.HTTPAddr}
	n.open(clock)
	t.Cleanup(func() { n.close() })
	return n
}

func (n *testNode) open(clock func() time.Time) {
	n.t.Helper()
	m := NewMain(n.cfg, newLogger(n.cfg, testLogWriter(n.t)), func(string) string { return "" })
	m.now = clock
	ctx, cancel := untilDeadline(n.t)
	defer cancel()
	err := m.Open(ctx)
	if err != nil {
		_ = m.Close(context.Background())
	}
	require.NoError(n.t, err)
	n.mu.Lock()
	n.m = m
	n.mu.Unlock()
}

// close stops the node cleanly (idempotent).
func (n *testNode) close() {
	n.mu.Lock()
	m := n.m
	n.m = nil
	n.mu.Unlock()
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_ = m.Close(ctx)
}

// crash stops the node the way a killed process stops: its NATS
// connection drops first, so nothing more is acked and its lease is
// never deleted (it expires), then the rest is torn down.
func (n *testNode) crash() {
	n.mu.Lock()
	m := n.m
	n.m = nil
	n.mu.Unlock()
	m.nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_ = m.Close(ctx)
}

func (n *testNode) main() *Main {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.m
}

// startConvergedNodes starts count nodes of 6 partitions, with one
// stream replica, on nc and one clock, each config changed by edit,
// and waits until every node agrees on copies owners per partition.
func startConvergedNodes(t *testing.T, nc *natsCluster, count, copies int, edit func(cfg *Config)) []*testNode {
	t.Helper()
	clock := testClock()
	var nodes []*testNode
	var names []string
	for i := range count {
		cfg := clusterNodeConfig(t, nc, i, 6)
		cfg.Cluster.Copies = copies
		cfg.Cluster.StreamReplicas = 1
		edit(&cfg)
		require.NoError(t, cfg.Validate())
		nodes = append(nodes, startNode(t, cfg, clock))
		names = append(names, cfg.Cluster.NodeName)
	}
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), copies, names) })
	}
	return nodes
}

func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// converged reports whether, as node m sees it, every partition has
// exactly the desired copies caught up and no other node answers.
func converged(m *Main, copies int, nodes []string) bool {
	mem := m.cluster.members
	live := mem.Nodes()
	if len(live) != len(nodes) {
		return false
	}
	for p := range mem.Partitions() {
		owners := mem.Owners(p)
		want := mem.Desired(p)
		if len(want) != min(copies, len(nodes)) || len(owners) != len(want) {
			return false
		}
		for _, o := range owners {
			if !slices.Contains(want, o.Node) {
				return false
			}
		}
	}
	return true
}

// copiesOf says, for a failure message, how many readings of dev each
// node stores and whether its own view makes it an owner of dev's
// partition. It is a fmt.Stringer, so it is worked out when the
// message is printed, not when the wait starts.
type copiesOf struct {
	t     *testing.T
	nodes []*testNode
	dev   string
}

func (c copiesOf) String() string {
	var b strings.Builder
	for _, n := range c.nodes {
		m := n.main()
		if m == nil {
			fmt.Fprintf(&b, " %s: down;", n.cfg.Cluster.NodeName)
			continue
		}
		mem := m.cluster.members
		p := partition.Of(mem.Partitions(), c.dev)
		var owners []string
		for _, o := range mem.Owners(p) {
			owners = append(owners, o.Node)
		}
		fmt.Fprintf(&b, " %s: %d stored, partition %d owned by %v, wanted here %v;",
			n.cfg.Cluster.NodeName, storedOn(c.t, m, c.dev), p, owners, slices.Contains(mem.Wanted(), p))
	}
	return b.String()
}

// storedOn counts the readings of dev in node m's own store.
func storedOn(t *testing.T, m *Main, dev string) int {
	t.Helper()
	rs, err := m.store.Latest(context.Background(), buckets.DeviceID(dev), 1000)
	require.NoError(t, err)
	return len(rs)
}
