package ingest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest/partition"
)

// CheckMapping verifies, for streams per partition (PartitionStreams),
// that the server maps a publish on <prefix>.<device> to the stream of
// the device's partition (partition.Mapping): an external server needs
// the mapping in its configuration, and without it no stream would
// take the devices' publishes. It creates the partitions' streams that
// are missing and, for each partition, publishes to a device of that
// partition expecting that partition's stream and a last sequence no
// stream has, so nothing is stored: the stream's refusal of the
// sequence says the mapping sends the partition there. A mapping into
// another partition count sends some probe to another stream, or to
// none, and is refused too.
func CheckMapping(ctx context.Context, js jetstream.JetStream, c Config) error {
	if !c.PartitionStreams || c.Intake { // the intake routes by partition itself
		return nil
	}
	for p := range c.Partitions {
		if err := checkMapping(ctx, js, c, p); err != nil {
			return err
		}
	}
	return nil
}

// checkMapping is CheckMapping of partition p.
func checkMapping(ctx context.Context, js jetstream.JetStream, c Config, p int) error {
	cp := c.ForPartition(p)
	if _, err := EnsureStream(ctx, js, cp, cp.Logger); err != nil {
		return err
	}
	dev := mappingProbe(c.Partitions, p)
	msg := nats.NewMsg(c.Subjects().Device(dev))
	_, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(cp.Stream), jetstream.WithExpectLastSequence(math.MaxUint64),
		jetstream.WithRetryAttempts(0))
	var apiErr *jetstream.APIError
	src, dst := partition.Mapping(c.Subjects().Prefix, c.Partitions)
	switch {
	case errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return nil
	case err == nil:
		return fmt.Errorf("check the partition mapping: stream %s stored a message expecting last sequence %d", cp.Stream, uint64(math.MaxUint64))
	case errors.Is(err, jetstream.ErrNoStreamResponse) && !hasLeader(ctx, js, cp.Stream):
		// Nobody answers for a replicated stream without a leader (an
		// outage of its servers): that says nothing of the mapping.
		return fmt.Errorf("check the partition mapping: stream %s has no leader now, so no publish on %s (partition %d) is answered; retry once it has one",
			cp.Stream, msg.Subject, p)
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		return fmt.Errorf("%w: no stream takes a publish on %s (partition %d): the NATS server must map %q to %q (mappings in the account's configuration) for %d streams per partition",
			errPermanent, msg.Subject, p, src, dst, c.Partitions)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStreamNotMatch:
		return fmt.Errorf("%w: a publish on %s (partition %d) went to another stream than %s: the NATS server must map %q to %q, for %d partitions",
			errPermanent, msg.Subject, p, cp.Stream, src, dst, c.Partitions)
	}
	return fmt.Errorf("check the partition mapping: publish on %s to stream %s: %w", msg.Subject, cp.Stream, err)
}

// hasLeader reports whether stream's info names a leader (a stream not
// replicated always has one); a stream that does not answer has none.
func hasLeader(ctx context.Context, js jetstream.JetStream, stream string) bool {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return false
	}
	cl := st.CachedInfo().Cluster
	return cl == nil || cl.Leader != ""
}

// mappingProbe is a device ID of partition p among n.
func mappingProbe(n, p int) string {
	for i := 0; ; i++ {
		if dev := "mapping-check-" + strconv.Itoa(i); partition.Of(n, dev) == p {
			return dev
		}
	}
}

// errCodeStreamNotMatch is the server's answer to a publish stored by
// another stream than the one expected (JSStreamNotMatchErr).
const errCodeStreamNotMatch jetstream.ErrorCode = 10060
