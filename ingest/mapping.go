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
// take the devices' publishes. It creates partition 0's stream if
// missing and publishes to a device of that partition expecting a last
// sequence no stream has, so nothing is stored: the stream's refusal
// says the mapping is in place, no answer that it is missing.
func CheckMapping(ctx context.Context, js jetstream.JetStream, c Config) error {
	if !c.PartitionStreams || c.Intake { // the intake routes by partition itself
		return nil
	}
	c0 := c.ForPartition(0)
	if _, err := EnsureStream(ctx, js, c0, c0.Logger); err != nil {
		return err
	}
	dev := mappingProbe(c.Partitions)
	msg := nats.NewMsg(c.Subjects().Device(dev))
	_, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(c0.Stream), jetstream.WithExpectLastSequence(math.MaxUint64),
		jetstream.WithRetryAttempts(0))
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return nil
	case err == nil:
		return fmt.Errorf("check the partition mapping: stream %s stored a message expecting last sequence %d", c0.Stream, uint64(math.MaxUint64))
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		src, dst := partition.Mapping(c.Subjects().Prefix, c.Partitions)
		return fmt.Errorf("%w: no stream takes a publish on %s: the NATS server must map %q to %q (mappings in the account's configuration) for %d streams per partition",
			errPermanent, msg.Subject, src, dst, c.Partitions)
	}
	return fmt.Errorf("check the partition mapping: publish on %s to stream %s: %w", msg.Subject, c0.Stream, err)
}

// mappingProbe is a device ID of partition 0 among n.
func mappingProbe(n int) string {
	for i := 0; ; i++ {
		if dev := "mapping-check-" + strconv.Itoa(i); partition.Of(n, dev) == 0 {
			return dev
		}
	}
}
