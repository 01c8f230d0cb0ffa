package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/cluster"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest"
	ingestcluster "github.com/telemetryd/telemetryd/ingest/cluster"
	"github.com/telemetryd/telemetryd/ingest/ownership"
	"github.com/telemetryd/telemetryd/ingest/partition"
	"github.com/telemetryd/telemetryd/retention"
)

// validateCluster checks the cluster flags (package clustercfg).
func (c *Config) validateCluster() error {
	return c.Cluster.Validate(c.NATSURL, c.Security.CursorKey)
}

// clusterCredential is the secret of node-to-node calls (package
// clustercfg).
func (c *Config) clusterCredential() (string, error) {
	return c.Cluster.Credential(c.Security.CursorKey)
}

// clusterNode is this node's share of a cluster: its lease, the
// partition consumers (package ingest/cluster) and the query router.
type clusterNode struct {
	members *ownership.Membership
	node    *ingestcluster.Node
	router  *cluster.Router

	cancel context.CancelFunc // stops the lease's renewals
	wg     sync.WaitGroup
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
	if m.sec.Creds != nil {
		callers = m.sec.Creds.TokenNamed
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
	node, err := ingestcluster.New(ingestcluster.Config{
		Members:    members,
		Consumers:  clusterConsumers{m: m, js: js},
		Store:      m.store,
		Everywhere: router,
		Dropped: func(ctx context.Context, d buckets.TableDrop) {
			d.Reason = retention.ReasonManual
			m.countManualDrop(ctx, d)
		},
		Logger: m.log.With("component", "cluster"),
		Now:    m.now,
	})
	if err != nil {
		return err
	}
	m.cluster = &clusterNode{members: members, node: node, router: router}
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
	c.Admin = clusterAdmin{node: m.cluster.node, local: admin{store: m.store, ret: m.ret}}
	c.Internal = r.Handler()
	c.Cluster = clusterView{m.cluster.members}
	return withDashboards(c, r)
}

// clusterAdmin drops tables on every node; retention stays per node.
type clusterAdmin struct {
	node  *ingestcluster.Node
	local admin
}

func (a clusterAdmin) DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error) {
	d, err := a.node.DropTable(ctx, day)
	if err == nil {
		d.Reason = retention.ReasonManual
	}
	return d, err
}

func (a clusterAdmin) RunRetention(ctx context.Context, dryRun bool) (buckets.RetentionReport, error) {
	return a.local.RunRetention(ctx, dryRun)
}

// runCluster renews the lease and follows the partitions this node
// should consume until closeCluster.
func (m *Main) runCluster() {
	c := m.cluster
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.wg.Go(func() { c.members.Run(ctx) })
	c.node.Start()
}

// closeCluster stops every partition consumer (their durable consumers
// stay, so a restart resumes them), then deletes the lease.
func (m *Main) closeCluster(ctx context.Context) error {
	c := m.cluster
	if c == nil || c.cancel == nil {
		return nil
	}
	err := c.node.Close(ctx)
	c.cancel()
	c.wg.Wait()
	return err
}

// clusterConsumers makes the partition consumers: one ingester per
// partition, with its own durable consumer named after this node.
type clusterConsumers struct {
	m  *Main
	js jetstream.JetStream
}

// consumerName is the durable consumer of partition p on this node.
func (cc clusterConsumers) consumerName(p int) string {
	return "ingest-" + cc.m.cfg.Cluster.NodeName + "-p" + strconv.Itoa(p)
}

func (cc clusterConsumers) Consumer(p int) (ingestcluster.Consumer, error) {
	m := cc.m
	icfg := m.ingestConfig()
	icfg.MQTTCopies = false // a cluster node has no embedded MQTT listener
	icfg.Partitions, icfg.Partition = m.cfg.Cluster.Partitions, p
	icfg.Replicas = m.cfg.Cluster.StreamReplicas
	icfg.Consumer = cc.consumerName(p)
	icfg.Exclusive = true // named after this node, whose name is unique (leases)
	icfg.Positions = ingestcluster.Positions{Store: m.store, Partition: p}
	icfg.Tombstones = ingestcluster.Tombstones{Local: m.store, Cluster: m.cluster.members}
	// The consumer share of the memory budget is split between the
	// partitions, each keeping room for the largest message.
	icfg.PullMaxBytes = int(max(m.budget.PullBytes/int64(m.cfg.Cluster.Partitions), minPullBytes))
	icfg.Logger = m.log.With("component", "ingest", "partition", p)
	icfg.TracerProvider, icfg.MeterProvider, icfg.Now = m.tel.Tracer, m.tel.Meter, m.now
	return ingest.New(m.nc, m.store, icfg)
}

func (cc clusterConsumers) Remove(ctx context.Context, p int) error {
	err := cc.js.DeleteConsumer(ctx, ingest.DefaultConfig().Stream, cc.consumerName(p))
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete consumer %s: %w", cc.consumerName(p), err)
	}
	return nil
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
