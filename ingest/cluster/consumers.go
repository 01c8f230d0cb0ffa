package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest"
)

// IngestStore is the local store as partition consumers use it: they
// write to it, keep their positions and read its tombstones
// (store.Store).
type IngestStore interface {
	ingest.Writer
	PositionStore
	LocalTombstones
}

// PartitionConsumers makes a node's partition consumers (Consumers):
// one ingest.Ingester per partition, with a durable consumer of its own
// named after the node, its positions and the cluster-wide tombstones.
type PartitionConsumers struct {
	NC    *nats.Conn
	Store IngestStore
	// Drops is the cluster-wide record of dropped days and deleted
	// devices (the membership).
	Drops interface {
		DroppedAt(day buckets.Day) (time.Time, bool)
		DeletedAt(dev buckets.DeviceID) (time.Time, bool)
	}
	// Node is this node's unique name (the leases).
	Node string
	// Template is the ingest configuration of every partition: the
	// stream, subjects and replicas, and PullMaxBytes and Logger meant
	// for each partition. Partitions is the partition count.
	Template ingest.Config
}

// ConsumerName is the durable consumer of partition p on node.
func ConsumerName(node string, p int) string {
	return "ingest-" + node + "-p" + strconv.Itoa(p)
}

// Consumer returns an ingester of partition p, not yet running.
func (pc PartitionConsumers) Consumer(p int) (Consumer, error) {
	icfg := pc.Template
	icfg.Partition = p
	icfg.Consumer = ConsumerName(pc.Node, p)
	icfg.Exclusive = true // named after this node, whose name is unique (leases)
	icfg.Positions = Positions{Store: pc.Store, Partition: p}
	icfg.Tombstones = Tombstones{Local: pc.Store, Cluster: pc.Drops}
	if icfg.Logger != nil {
		icfg.Logger = icfg.Logger.With("partition", p)
	}
	return ingest.New(pc.NC, pc.Store, icfg)
}

// Remove deletes the durable consumer of partition p; one already gone
// is no error.
func (pc PartitionConsumers) Remove(ctx context.Context, p int) error {
	js, err := jetstream.New(pc.NC)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	stream := pc.Template.Stream
	if stream == "" {
		stream = ingest.DefaultConfig().Stream
	}
	name := ConsumerName(pc.Node, p)
	if err := js.DeleteConsumer(ctx, stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete consumer %s: %w", name, err)
	}
	return nil
}

var _ Consumers = PartitionConsumers{}
