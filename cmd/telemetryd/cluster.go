package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/cluster"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/cmd/internal/clusterstreams"
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
	icfg    ingest.Config           // the partitions' ingest settings (a repaired day's replay reads them)
	streams *clusterstreams.Streams // nil with the one stream

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

// Holders is every live node whose lease holds p or is caught up on it.
func (v membershipView) Holders(p int) []cluster.Peer {
	var out []cluster.Peer
	for _, l := range v.m.Nodes() {
		if slices.Contains(l.Holding, p) || slices.Contains(l.Ready, p) {
			out = append(out, cluster.Peer{Node: l.Node, URL: l.URL, Self: l.Node == v.m.Node()})
		}
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
	var node *ingestcluster.Node // made below, with the router as its Everywhere
	router, err := cluster.New(cluster.Config{
		// This node's own state, not the leases others read, says which reads its copy serves, and which it marks partial.
		Serves:     func(p int) bool { return node != nil && node.Serves(p) },
		Trailing:   func(p int) bool { return node != nil && node.Trailing(p) || m.replaying.Load() },
		Local:      m.store,
		Dropped:    m.countManualDrop,
		Membership: membershipView{members},
		Credential: credential,
		Callers:    callers,
		Logger:     m.log.With("component", "cluster"),
	})
	if err != nil {
		return err
	}
	icfg := m.ingestConfig()
	icfg.MQTTCopies = false // a cluster node has no embedded MQTT listener
	icfg.Partitions, icfg.Replicas = k.Partitions, k.StreamReplicas
	// The consumer share of the memory budget is split between the
	// partitions, each keeping room for the largest message.
	icfg.PullMaxBytes = int(max(m.budget.PullBytes/int64(k.Partitions), minPullBytes))
	icfg.Logger = m.log.With("component", "ingest")
	icfg.TracerProvider, icfg.MeterProvider, icfg.Now = m.tel.Tracer, m.tel.Meter, m.now
	var streams *clusterstreams.Streams
	if k.PartitionStreams {
		icfg.PartitionStreams = true
		// The family shares -stream-max-bytes, in equal parts.
		icfg.StreamMaxBytes = max(icfg.StreamMaxBytes/int64(k.Partitions), 1<<20)
		if streams, err = clusterstreams.Open(octx, m.nc, js, members, icfg, m.log.With("component", "cluster")); err != nil {
			return err
		}
	}
	node, err = ingestcluster.New(ingestcluster.Config{
		Members: members,
		Consumers: ingestcluster.PartitionConsumers{
			NC: m.nc, Store: m.store, Drops: members, Node: k.NodeName, Template: icfg},
		Store:      m.store,
		Everywhere: router,
		Dropped:    m.countManualDrop,
		Seed:       router.CopyAttributes, // attributes set over HTTP are not in the stream
		Logger:     m.log.With("component", "cluster"),
		Now:        m.now,
	})
	if err != nil {
		return err
	}
	m.cluster = &clusterNode{members: members, node: node, router: router, icfg: icfg, streams: streams}
	return nil
}

// withCluster routes the API through the cluster router.
func (m *Main) withCluster(c *api.Config) error {
	r := m.cluster.router
	c.Reader = r
	c.Attributes = r
	c.Admin = clusterAdmin{node: m.cluster.node, local: admin{store: m.store, ret: m.ret}}
	c.Internal = r.Handler()
	c.Cluster = clusterView{m: m.cluster.members, streams: m.cluster.streams}
	if s := m.cluster.streams; s != nil {
		c.Streams = s.Names() // /readyz names the partitions' streams
	}
	return c.WithDashboards(r)
}

// clusterAdmin drops tables and deletes devices on every node;
// retention stays per node.
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

func (a clusterAdmin) DeleteDevice(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error) {
	return a.node.DeleteDevice(ctx, dev)
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
	if c.streams != nil {
		c.wg.Go(func() { c.streams.Run(ctx) })
	}
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
