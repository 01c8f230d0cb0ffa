package ingest

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest/partition"
)

// Partitioned consumption (deploy/CLUSTER.md). With Config.Partitions set, the
// stream stores <prefix>.<device> as <prefix>.<partition>.<device> (a
// subject transform, see package partition) and this Ingester reads
// one partition. The partition count is fixed for the life of the
// stream: a different count would send a device's later messages to
// another partition than its earlier ones, so it is refused with the
// count the stream has.

// errMigration ends the refusal of a partition count change.
const errMigration = "the partition count is fixed for the life of the stream (see \"Changing the partition count\" in deploy/CLUSTER.md)"

// validatePartitions checks Partitions, Partition and Replicas.
func (c Config) validatePartitions() error {
	if c.Replicas < 0 || c.Replicas > 5 {
		return fmt.Errorf("replicas %d: want 0 (server default) to 5", c.Replicas)
	}
	if c.Partitions == 0 {
		if c.PartitionStreams || c.Intake {
			return errors.New("streams per partition without partitions")
		}
		if c.Partition != 0 {
			return fmt.Errorf("partition %d without partitions", c.Partition)
		}
		return nil
	}
	if err := partition.Validate(c.Partitions); err != nil {
		return err
	}
	if c.Partition < 0 || c.Partition >= c.Partitions {
		return fmt.Errorf("partition %d: want 0 to %d", c.Partition, c.Partitions-1)
	}
	if c.Intake && !c.PartitionStreams {
		return errors.New("the intake needs a stream per partition")
	}
	if c.MQTTCopies && !c.PartitionStreams {
		return errors.New("the MQTT listener's store copies cannot be captured by a partitioned stream")
	}
	return nil
}

// partitioned adds the partition transform and the replica count to the
// configuration of a stream to create.
func (c Config) partitioned(sc jetstream.StreamConfig) jetstream.StreamConfig {
	sc.Replicas = c.Replicas
	if c.Partitions > 0 && !c.PartitionStreams {
		t := partition.Transform(c.SubjectPrefix, c.Partitions)
		sc.SubjectTransform = &t
	}
	return sc
}

// checkPartitions refuses a stream whose partitioning differs from
// Config.Partitions.
func (in *Ingester) checkPartitions(sc jetstream.StreamConfig) error {
	if in.cfg.PartitionStreams {
		want := partition.Subjects(in.cfg.SubjectPrefix, in.cfg.Partition)
		if in.cfg.Intake {
			want = intakeSubjects(in.cfg.SubjectPrefix, in.cfg.Partition)
		}
		if !slices.Contains(sc.Subjects, want) {
			return fmt.Errorf("%w: stream %s does not capture %s, its partition's subjects", errPermanent, sc.Name, want)
		}
		return nil
	}
	n, err := partition.Count(in.cfg.SubjectPrefix, sc.SubjectTransform)
	switch {
	case errors.Is(err, partition.ErrNotPartitioned), in.cfg.Subjects().IsMQTTCopiesTransform(sc.SubjectTransform):
		n = 0
	case err != nil:
		return fmt.Errorf("%w: stream %s: %w", errPermanent, sc.Name, err)
	}
	if n == in.cfg.Partitions {
		return nil
	}
	switch {
	case n == 0:
		return fmt.Errorf("%w: stream %s is not partitioned, so it cannot serve -partitions %d; %s",
			errPermanent, sc.Name, in.cfg.Partitions, errMigration)
	case in.cfg.Partitions == 0:
		return fmt.Errorf("%w: stream %s is partitioned into %d; a single node (-partitions 0) cannot read it; %s",
			errPermanent, sc.Name, n, errMigration)
	default:
		return fmt.Errorf("%w: stream %s is partitioned into %d, not -partitions %d; %s",
			errPermanent, sc.Name, n, in.cfg.Partitions, errMigration)
	}
}

// partitionFilter limits a consumer to the partition read.
func (in *Ingester) partitionFilter(cc *jetstream.ConsumerConfig) {
	if in.cfg.Partitions > 0 && !in.cfg.PartitionStreams { // a partition's own stream needs none
		cc.FilterSubjects = []string{partition.Filter(in.cfg.SubjectPrefix, in.cfg.Partition)}
	}
}

// resetPending redelivers at once what an Exclusive consumer had
// delivered and not settled when it was set up. Nothing in this
// process holds those deliveries (the process that took them was
// killed, or this one's earlier consume was stopped), so they would
// otherwise wait out AckWait, and a node returning to the cluster
// would answer for its partition only that much later (its ack floor
// stays below them). The consumer is reset to its ack floor: every
// message above it is delivered again, and one that had been committed
// is written again with the same keys and values. Acks are sent only
// after a commit, so a late ack of an earlier delivery is still true.
// A server without the reset API (before 2.14) leaves the deliveries
// to AckWait, as before.
func (in *Ingester) resetPending(ctx context.Context, cons jetstream.Consumer) jetstream.Consumer {
	info := cons.CachedInfo()
	if !in.cfg.Exclusive || info.NumAckPending == 0 {
		return cons
	}
	if _, err := in.js.ResetConsumer(ctx, in.cfg.Stream, in.cfg.Consumer); err != nil {
		in.log.Warn("could not reset the consumer to its ack floor; what an earlier run left unacked is redelivered after the ack wait",
			"consumer", in.cfg.Consumer, "ack_pending", info.NumAckPending, "ack_wait", in.cfg.AckWait, "err", err)
		return cons
	}
	in.log.Info("redelivering at once what an earlier run left unacked", "consumer", in.cfg.Consumer,
		"ack_pending", info.NumAckPending, "ack_floor", info.AckFloor.Stream)
	if c, err := in.js.Consumer(ctx, in.cfg.Stream, in.cfg.Consumer); err == nil {
		return c
	}
	return cons
}

// deviceToken is the device token of a stored subject ("" when there
// is none).
func (in *Ingester) deviceToken(subject string) string { return in.cfg.deviceToken(subject) }

// deviceToken is the device token of a subject stored in c's stream
// ("" when there is none): partitioned subjects carry the partition
// before the device.
func (c Config) deviceToken(subject string) string {
	if c.Partitions > 0 {
		return partition.DeviceToken(c.SubjectPrefix, subject)
	}
	return c.Subjects().DeviceToken(subject)
}

// Backlog reports how far the consumer is behind: the messages of its
// partition not yet delivered plus those delivered and not yet acked,
// and whether its ack floor has passed the stream's last sequence at
// the time the consumer was set up (everything stored before it
// started is settled). A node answers for a partition only once one
// of the two says it caught up (see CaughtUp).
func (in *Ingester) Backlog(ctx context.Context) (pending uint64, passedStart bool, err error) {
	in.mu.Lock()
	cons, start := in.cons, in.startSeq
	in.mu.Unlock()
	if cons == nil {
		return 0, false, errNotStarted
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("consumer info: %w", err)
	}
	return info.NumPending + uint64(info.NumAckPending), info.AckFloor.Stream >= start, nil
}

// CaughtUp reports whether the consumer has settled everything the
// stream held when it was set up: its backlog was empty or its ack
// floor passed that point.
func (in *Ingester) CaughtUp(ctx context.Context) (bool, error) {
	pending, passed, err := in.Backlog(ctx)
	if err != nil {
		return false, err
	}
	return pending == 0 || passed, nil
}
