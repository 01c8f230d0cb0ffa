package main

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/api/cluster"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/ownership"
	"github.com/telemetryd/telemetryd/ingest/partition"
	"github.com/telemetryd/telemetryd/retention"
)

// ClusterConfig is the scale-out configuration (deploy/CLUSTER.md). With
// Partitions 0 the service is a single node and nothing here applies.
type ClusterConfig struct {
	Partitions     int
	Copies         int
	NodeName       string
	AdvertiseURL   string
	LeaseTTL       time.Duration
	ClusterToken   string // the cluster credential; default derived from -cursor-key
	StreamReplicas int
}

// defaultCluster returns the cluster defaults: off.
func defaultCluster() ClusterConfig {
	return ClusterConfig{
		Copies:         ownership.DefaultCopies,
		LeaseTTL:       ownership.DefaultLeaseTTL,
		StreamReplicas: 3,
	}
}

func (c *ClusterConfig) bind(fs *flag.FlagSet) {
	fs.IntVar(&c.Partitions, "partitions", c.Partitions, "split the devices into this many partitions shared by the nodes of a cluster (0: a single node); fixed for the life of the stream")
	fs.IntVar(&c.Copies, "copies", c.Copies, "cluster: how many nodes store each partition")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "cluster: this node's unique name (empty: the host name)")
	fs.StringVar(&c.AdvertiseURL, "advertise-url", c.AdvertiseURL, "cluster: the HTTP base URL other nodes use to reach this one, e.g. http://node-1:8080")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "cluster: a node whose lease is not renewed for this long is gone and its partitions are taken over")
	fs.StringVar(&c.ClusterToken, "cluster-token", c.ClusterToken, "cluster: the secret nodes present to each other's node-to-node API, the same on every node (at least 16 characters; not a token of the auth file); empty: derived from -cursor-key")
	fs.IntVar(&c.StreamReplicas, "stream-replicas", c.StreamReplicas, "cluster: replicas of the streams and the lease bucket when a node creates them")
}

// validateCluster checks the cluster flags together with the others.
func (c *Config) validateCluster() error {
	k := c.Cluster
	if k.Partitions == 0 {
		return nil
	}
	var errs []error
	if k.NodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			errs = append(errs, fmt.Errorf("-node-name: empty, and the host name is unknown: %w", err))
		}
		c.Cluster.NodeName, k.NodeName = host, host
	}
	if err := partition.Validate(k.Partitions); err != nil {
		errs = append(errs, fmt.Errorf("-partitions: %w", err))
	}
	if k.Copies < 1 || k.Copies > 5 {
		errs = append(errs, fmt.Errorf("-copies %d: want 1 to 5", k.Copies))
	}
	if err := ownership.ValidateNodeName(k.NodeName); err != nil {
		errs = append(errs, fmt.Errorf("-node-name: %w", err))
	}
	if u, err := url.Parse(k.AdvertiseURL); k.AdvertiseURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("-advertise-url %q: a cluster node needs the http(s) base URL other nodes reach it at", k.AdvertiseURL))
	}
	if c.NATSURL == "" {
		errs = append(errs, errors.New("-partitions: a cluster node needs -nats-url pointing at the NATS JetStream cluster (the embedded server is a single node)"))
	}
	if k.LeaseTTL < ownership.MinLeaseTTL {
		errs = append(errs, fmt.Errorf("-lease-ttl %s: want at least %s", k.LeaseTTL, ownership.MinLeaseTTL))
	}
	if k.StreamReplicas < 1 || k.StreamReplicas > 5 {
		errs = append(errs, fmt.Errorf("-stream-replicas %d: want 1 to 5", k.StreamReplicas))
	}
	if c.Security.CursorKey == "" {
		errs = append(errs, errors.New("-partitions: a cluster node needs -cursor-key, the same on every node, so a cursor made by one node continues on any other"))
	}
	if k.ClusterToken != "" && len(k.ClusterToken) < auth.MinSecretLen {
		errs = append(errs, fmt.Errorf("-cluster-token has %d characters; use at least %d random ones (or leave it empty to derive one from -cursor-key)", len(k.ClusterToken), auth.MinSecretLen))
	}
	return errors.Join(errs...)
}

// clusterCredentialInfo separates the cluster credential derived from
// the cursor key from the cursor key itself.
const clusterCredentialInfo = "telemetryd cluster credential v1"

// clusterCredential is the secret of node-to-node calls: -cluster-token,
// else one derived from -cursor-key (which every node of a cluster
// shares; the derivation does not reveal it). Never -admin-token: a
// node-to-node call reads any device for its caller, and an admin-only
// token may not read.
func (c *Config) clusterCredential() (string, error) {
	if c.Cluster.ClusterToken != "" {
		return c.Cluster.ClusterToken, nil
	}
	key, err := hkdf.Key(sha256.New, []byte(c.Security.CursorKey), nil, clusterCredentialInfo, 32)
	if err != nil {
		return "", fmt.Errorf("cluster credential: %w", err)
	}
	return hex.EncodeToString(key), nil
}

// clusterNode runs this node's share of a cluster: its lease, the
// consumers of the partitions it owns, and the query router.
type clusterNode struct {
	m       *Main
	members *ownership.Membership
	router  *cluster.Router
	js      jetstream.JetStream

	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	parts map[int]*partitionConsumer
}

// partitionConsumer is one partition's ingester.
type partitionConsumer struct {
	ing    *ingest.Ingester
	cancel context.CancelFunc
	done   chan struct{}
	ready  bool
}

// membershipView adapts ownership.Membership to cluster.Membership.
type membershipView struct{ m *ownership.Membership }

func (v membershipView) Partitions() int { return v.m.Partitions() }
func (v membershipView) PartitionOf(dev buckets.DeviceID) int {
	return partition.Of(v.m.Partitions(), string(dev))
}
func (v membershipView) Owners(p int) []cluster.Peer {
	var out []cluster.Peer
	for _, o := range v.m.Owners(p) {
		out = append(out, cluster.Peer(o))
	}
	return out
}
func (v membershipView) Nodes() []cluster.Peer {
	var out []cluster.Peer
	for _, l := range v.m.Nodes() {
		out = append(out, cluster.Peer{Node: l.Node, URL: l.URL, Self: l.Node == v.m.Node()})
	}
	return out
}

// openCluster takes this node's lease and builds the router; runCluster
// starts consuming once the API listens.
func (m *Main) openCluster(ctx context.Context) error {
	k := m.cfg.Cluster
	js, err := jetstream.New(m.nc)
	if err != nil {
		return fmt.Errorf("cluster: jetstream: %w", err)
	}
	members, err := ownership.New(js, ownership.Config{
		Node: k.NodeName, URL: k.AdvertiseURL, Partitions: k.Partitions, Copies: k.Copies,
		LeaseTTL: k.LeaseTTL, Replicas: k.StreamReplicas,
		Logger: m.log.With("component", "cluster"), Now: m.now,
	})
	if err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := members.Open(octx); err != nil {
		return err
	}
	credential, err := m.cfg.clusterCredential()
	if err != nil {
		return err
	}
	var callers cluster.Callers
	if m.sec.creds != nil {
		callers = m.sec.creds.TokenNamed
	}
	router, err := cluster.New(cluster.Config{
		Local:      localStore{st: m.store, count: m.countManualDrop},
		Membership: membershipView{members},
		Credential: credential,
		Callers:    callers,
		HTTPClient: m.clusterHTTPClient(),
		Logger:     m.log.With("component", "cluster"),
	})
	if err != nil {
		return err
	}
	m.cluster = &clusterNode{m: m, members: members, router: router, js: js, parts: map[int]*partitionConsumer{}}
	return nil
}

// localStore is the store as the router's Local (DropTable marks the
// drop manual, as the admin endpoint does).
type localStore struct {
	st    storeReader
	count func(context.Context, buckets.TableDrop) // counts the drop in the retention metrics
}

func (l localStore) Device(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceInfo, error) {
	return l.st.Device(ctx, dev)
}
func (l localStore) Assign(ctx context.Context, as []buckets.Assignment) error {
	return l.st.Assign(ctx, as)
}
func (l localStore) AttributeNames(ctx context.Context, q buckets.DeviceQuery) ([]string, error) {
	return l.st.AttributeNames(ctx, q)
}
func (l localStore) AttributeValues(ctx context.Context, name string, q buckets.DeviceQuery) ([]string, error) {
	return l.st.AttributeValues(ctx, name, q)
}

func (l localStore) Latest(ctx context.Context, dev buckets.DeviceID, n int) ([]buckets.Reading, error) {
	return l.st.Latest(ctx, dev, n)
}
func (l localStore) Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error) {
	return l.st.Range(ctx, q)
}
func (l localStore) Get(ctx context.Context, dev buckets.DeviceID, k buckets.Ticks) (buckets.Reading, error) {
	return l.st.Get(ctx, dev, k)
}
func (l localStore) Devices(ctx context.Context, q buckets.DeviceQuery) ([]buckets.DeviceInfo, bool, error) {
	return l.st.Devices(ctx, q)
}
func (l localStore) Tables(ctx context.Context) ([]buckets.TableInfo, error) { return l.st.Tables(ctx) }
func (l localStore) Aggregate(ctx context.Context, q buckets.AggregateQuery) (buckets.AggregatePage, error) {
	return l.st.Aggregate(ctx, q)
}
func (l localStore) DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error) {
	d, err := l.st.DropTable(ctx, day)
	if err == nil {
		d.Reason = retention.ReasonManual
		l.count(ctx, d)
	}
	return d, err
}

// storeReader is the part of *store.Store a cluster node reads.
type storeReader interface {
	api.Reader
	api.Aggregator
	attributeStore
	DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error)
}

// withCluster routes the API through the cluster router.
func (m *Main) withCluster(c *api.Config) error {
	r := m.cluster.router
	c.Reader = r
	c.Attributes = r
	c.Admin = clusterAdmin{router: r, members: m.cluster.members, local: admin{store: m.store, ret: m.ret}, log: m.log}
	c.Internal = r.Handler()
	return withDashboards(c, r)
}

// clusterAdmin drops tables on every node; retention stays per node.
type clusterAdmin struct {
	router  *cluster.Router
	members *ownership.Membership
	local   admin
	log     *slog.Logger
}

// DropTable records the drop cluster-wide first (a node that is down
// or unreachable applies it when it is back, see applyDrops), then
// drops the day on every live node.
func (a clusterAdmin) DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error) {
	at := time.Now()
	if err := a.members.RecordDrop(ctx, day, at, false); err != nil {
		return buckets.TableDrop{Day: day, Readings: -1}, fmt.Errorf("table %s: %w: %w", day, err, buckets.ErrUnavailable)
	}
	d, err := a.router.DropTable(ctx, day)
	// Gone round: the nodes that did not answer may now apply it. (If
	// this fails, they do after the record's wait.)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	if rerr := a.members.RecordDrop(rctx, day, at, true); rerr != nil {
		a.log.Warn("record a cluster-wide drop as sent round", "day", day.String(), "err", rerr)
	}
	cancel()
	if err != nil {
		return d, err
	}
	d.Reason = "manual"
	return d, nil
}

func (a clusterAdmin) RunRetention(ctx context.Context, dryRun bool) (buckets.RetentionReport, error) {
	return a.local.RunRetention(ctx, dryRun)
}

// runCluster renews the lease and follows the partitions this node
// should consume until Close.
func (m *Main) runCluster() {
	c := m.cluster
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.wg.Go(func() { c.members.Run(ctx) })
	c.wg.Go(func() { c.follow(ctx) })
}

// closeCluster stops every partition consumer (their durable consumers
// stay, so a restart resumes them) and deletes the lease.
func (m *Main) closeCluster(ctx context.Context) error {
	c := m.cluster
	if c == nil || c.cancel == nil {
		return nil
	}
	c.cancel()
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for p, pc := range c.parts {
		pc.cancel()
		select {
		case <-pc.done:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("partition %d did not finish its batch: %w", p, ctx.Err()))
		}
	}
	return errors.Join(errs...)
}

// followEvery is how often the consumers are compared with the
// ownership and the catch-up of new ones checked.
const followEvery = 500 * time.Millisecond

// follow starts and stops partition consumers as ownership changes and
// publishes the partitions caught up on.
func (c *clusterNode) follow(ctx context.Context) {
	t := time.NewTicker(followEvery)
	defer t.Stop()
	for {
		c.step(ctx)
		select {
		case <-ctx.Done():
			return
		case <-c.members.Changes():
		case <-t.C:
		}
	}
}

// step brings the consumers in line with Wanted once.
func (c *clusterNode) step(ctx context.Context) {
	want := c.members.Wanted()
	c.mu.Lock()
	for _, p := range want {
		if _, ok := c.parts[p]; !ok {
			if err := c.start(p); err != nil {
				c.m.log.Error("start partition consumer", "partition", p, "err", err)
			}
		}
	}
	var drop []int
	for p := range c.parts {
		if !slices.Contains(want, p) {
			drop = append(drop, p)
		}
	}
	c.mu.Unlock()
	for _, p := range drop {
		c.stop(ctx, p)
	}
	c.mu.Lock()
	var ready, holding []int
	for p, pc := range c.parts {
		holding = append(holding, p)
		if !pc.ready {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ok, err := pc.ing.CaughtUp(cctx)
			cancel()
			if err == nil && ok {
				pc.ready = true
				c.m.log.Info("partition caught up", "partition", p)
			}
		}
		if pc.ready {
			ready = append(ready, p)
		}
	}
	c.mu.Unlock()
	c.applyDrops(ctx)
	c.members.SetHolding(holding)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.members.SetReady(rctx, ready); err != nil && ctx.Err() == nil {
		c.m.log.Warn("publish caught-up partitions", "err", err)
	}
}

// dropSkew is how much earlier than the cluster-wide record a node's
// own drop of a day may be stamped (the nodes' clocks differ) and still
// count as that drop.
const dropSkew = time.Minute

// applyDrops drops the days dropped cluster-wide that this node still
// holds without a drop of its own since: it was down or unreachable
// when the DELETE went round.
func (c *clusterNode) applyDrops(ctx context.Context) {
	for day, at := range c.members.Drops() {
		if own, ok := c.m.store.DroppedAt(day); ok && !own.Before(at.Add(-dropSkew)) {
			continue
		}
		d, err := c.m.store.DropTable(ctx, day)
		switch {
		case errors.Is(err, buckets.ErrNotFound), errors.Is(err, buckets.ErrUnavailable): // none, or being dropped
		case err != nil:
			c.m.log.Warn("drop a day dropped cluster-wide while this node was away", "day", day.String(), "err", err)
		default:
			d.Reason = retention.ReasonManual
			c.m.countManualDrop(ctx, d)
			c.m.log.Info("dropped a day dropped cluster-wide while this node was away", "day", day.String(),
				"dropped_cluster_wide", at, "size_bytes", d.SizeBytes)
		}
	}
}

// clusterTombstones are the store's tombstones and the cluster-wide
// drops together: a partition consumer skips a reading of a day
// dropped by either after its message was stored, so a node that
// replays the stream (a new owner, or one back from an outage) does
// not write a cluster-wide dropped day again.
type clusterTombstones struct {
	local   ingest.Tombstones
	cluster interface {
		DroppedAt(buckets.Day) (time.Time, bool)
	}
}

func (t clusterTombstones) DroppedAt(day buckets.Day) (time.Time, bool) {
	a, okA := t.local.DroppedAt(day)
	b, okB := t.cluster.DroppedAt(day)
	switch {
	case okA && okB:
		return maxTime(a, b), true
	case okB:
		return b, true
	}
	return a, okA
}

func (t clusterTombstones) HoldDrops() (release func()) { return t.local.HoldDrops() }

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// consumerName is the durable consumer of partition p on this node.
func (c *clusterNode) consumerName(p int) string {
	return "ingest-" + c.m.cfg.Cluster.NodeName + "-p" + strconv.Itoa(p)
}

// start runs a consumer for partition p (c.mu held).
func (c *clusterNode) start(p int) error {
	m := c.m
	icfg := ingest.DefaultConfig()
	icfg.SubjectPrefix = m.cfg.SubjectPrefix
	icfg.Window = m.window()
	icfg.Partitions, icfg.Partition = m.cfg.Cluster.Partitions, p
	icfg.Replicas = m.cfg.Cluster.StreamReplicas
	icfg.Consumer = c.consumerName(p)
	icfg.Exclusive = true // named after this node, whose name is unique (leases)
	icfg.Positions = partitionPositions{st: m.store, p: p}
	icfg.Tombstones = clusterTombstones{local: m.store, cluster: c.members}
	icfg.StreamMaxAge, icfg.StreamMaxBytes = m.cfg.StreamMaxAge, m.cfg.StreamMaxBytes
	icfg.RejectedMaxBytes = m.cfg.RejectedMaxBytes
	// The consumer share of the memory budget is split between the
	// partitions, each keeping room for the largest message.
	icfg.PullMaxBytes = int(max(m.budget.PullBytes/int64(m.cfg.Cluster.Partitions), minPullBytes))
	icfg.Logger = m.log.With("component", "ingest", "partition", p)
	icfg.TracerProvider, icfg.MeterProvider, icfg.Now = m.tel.Tracer, m.tel.Meter, m.now
	ing, err := ingest.New(m.nc, m.store, icfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	pc := &partitionConsumer{ing: ing, cancel: cancel, done: make(chan struct{})}
	c.parts[p] = pc
	go func() {
		defer close(pc.done)
		if err := ing.Run(ctx); err != nil {
			m.log.Error("partition consumer stopped", "partition", p, "err", err)
		}
	}()
	m.log.Info("consuming partition", "partition", p, "consumer", icfg.Consumer)
	return nil
}

// stop ends the consumer of a partition this node no longer owns and
// deletes its durable consumer; its saved position lets a later
// takeover resume where it stopped.
func (c *clusterNode) stop(ctx context.Context, p int) {
	c.mu.Lock()
	pc := c.parts[p]
	delete(c.parts, p)
	c.mu.Unlock()
	if pc == nil {
		return
	}
	pc.cancel()
	<-pc.done
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.js.DeleteConsumer(dctx, ingest.DefaultConfig().Stream, c.consumerName(p)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		c.m.log.Warn("delete consumer of a partition handed over", "partition", p, "err", err)
	}
	c.m.log.Info("partition handed over", "partition", p)
}

// ready reports whether this node can serve: its lease is held and at
// least one of its partitions caught up, or it owns none.
func (c *clusterNode) readyErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, pc := range c.parts {
		if err := pc.ing.Ready(); err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
	}
	return nil
}

// partitionPositions keeps one saved stream position per partition in
// the store, under "<stream>/p<N>".
type partitionPositions struct {
	st interface {
		ingest.Positions
	}
	p int
}

func (pp partitionPositions) key(stream string) string { return stream + "/p" + strconv.Itoa(pp.p) }

func (pp partitionPositions) LoadPosition(ctx context.Context, stream string) (buckets.StreamPosition, bool, error) {
	pos, ok, err := pp.st.LoadPosition(ctx, pp.key(stream))
	pos.Stream = stream
	return pos, ok, err
}

func (pp partitionPositions) SavePosition(ctx context.Context, pos buckets.StreamPosition) error {
	pos.Stream = pp.key(pos.Stream)
	return pp.st.SavePosition(ctx, pos)
}

// clusterConnsPerNode bounds the connections one node keeps to another.
// They are kept alive and reused, so node-to-node calls open few new
// connections, and several nodes behind one address stay within the
// per-address connection limit (-http-max-conns-per-client, 64): those
// limits apply before any credential is seen.
const clusterConnsPerNode = 16

// clusterHTTPClient makes node-to-node calls. Nodes serving HTTPS need
// certificates the system roots trust.
func (m *Main) clusterHTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxConnsPerHost = clusterConnsPerNode
	t.MaxIdleConnsPerHost = clusterConnsPerNode
	return &http.Client{Timeout: 30 * time.Second, Transport: t}
}
