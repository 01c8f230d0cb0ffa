package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/partition"
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
	in, err := ingest.New(pc.NC, pc.Store, icfg)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(pc.NC)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	resolved := icfg.ForPartition(p)
	c := &partitionConsumer{Ingester: in, js: js, stream: resolved.Stream, consumer: icfg.Consumer}
	if !resolved.PartitionStreams {
		c.filter = partition.Filter(resolved.SubjectPrefix, p)
		return c, nil
	}
	return pc.withUpgrade(c, icfg, js)
}

// partitionConsumer is a partition's ingester with its position in the
// stream.
type partitionConsumer struct {
	*ingest.Ingester
	js       jetstream.JetStream
	stream   string
	consumer string
	filter   string // the partition's subjects in a shared stream; "" for its own stream

	mu   sync.Mutex
	str  jetstream.Stream
	cons jetstream.Consumer
}

// Position is the consumer's ack floor and the stream sequence of the
// partition's last message (0 when it has none).
func (c *partitionConsumer) Position(ctx context.Context) (applied, head uint64, err error) {
	c.mu.Lock()
	str, cons := c.str, c.cons
	c.mu.Unlock()
	if str == nil {
		if str, err = c.js.Stream(ctx, c.stream); err != nil {
			return 0, 0, fmt.Errorf("stream %s: %w", c.stream, err)
		}
	}
	if cons == nil {
		if cons, err = str.Consumer(ctx, c.consumer); err != nil {
			return 0, 0, fmt.Errorf("consumer %s: %w", c.consumer, err)
		}
	}
	c.mu.Lock()
	c.str, c.cons = str, cons
	c.mu.Unlock()
	// The head first: a message stored after it is not waited for.
	if c.filter == "" {
		info, err := str.Info(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("stream %s: %w", c.stream, err)
		}
		head = info.State.LastSeq
	} else {
		m, err := str.GetLastMsgForSubject(ctx, c.filter)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return 0, 0, fmt.Errorf("last message of %s: %w", c.filter, err)
		default:
			head = m.Sequence
		}
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("consumer %s: %w", c.consumer, err)
	}
	return info.AckFloor.Stream, head, nil
}

// StepDown asks the servers to elect another leader for the consumer
// (JetStream's consumer leader step-down).
func (c *partitionConsumer) StepDown(ctx context.Context) error {
	subj := fmt.Sprintf("$JS.API.CONSUMER.LEADER.STEPDOWN.%s.%s", c.stream, c.consumer)
	if err := jsAPI(ctx, c.js.Conn(), subj, nil); err != nil {
		return fmt.Errorf("step down the leader of consumer %s: %w", c.consumer, err)
	}
	return nil
}

// Remove deletes the durable consumer of partition p; one already gone
// is no error.
func (pc PartitionConsumers) Remove(ctx context.Context, p int) error {
	js, err := jetstream.New(pc.NC)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	streams := []string{pc.Template.Family()} // the one stream, or the upgrade's old one
	if pc.Template.PartitionStreams {
		streams = append(streams, partition.Stream(pc.Template.Family(), p))
	}
	name := ConsumerName(pc.Node, p)
	for _, stream := range streams {
		err := js.DeleteConsumer(ctx, stream, name)
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("delete consumer %s of %s: %w", name, stream, err)
		}
	}
	return nil
}

var _ Consumers = PartitionConsumers{}
