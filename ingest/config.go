package ingest

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/partition"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// RejectedMaxAge is how long the rejected stream keeps dead letters.
const RejectedMaxAge = 7 * 24 * time.Hour

// Config configures an Ingester. A zero field takes its DefaultConfig
// value, so callers set only what they change.
type Config struct {
	// SubjectPrefix: devices publish on <prefix>.<device>. Default
	// "telemetry".
	SubjectPrefix string
	// Stream captures <prefix>.* with file storage. Default "TELEMETRY".
	Stream string
	// MQTTCopies makes Stream capture the embedded MQTT listener's store
	// copies of QoS 1 publishes (topology.Subjects.MQTTCopies) and keep
	// each as <prefix>.<device>, so it is read as a reading (see
	// CaptureMQTTCopies). Not with Partitions.
	MQTTCopies bool
	// AtomicPublish makes Stream allow atomic batch publishes (an
	// existing stream gains it; it is never taken away) and Publisher
	// publish each call's readings as atomic batches: on a JetStream
	// that fsyncs every write, one fsync then covers a line protocol
	// write instead of one per message. Worth it only then: without the
	// fsync the batch's staging costs more than it saves.
	AtomicPublish bool
	// StreamMaxAge bounds how long Stream keeps messages (acked or not),
	// so the raw stream cannot fill the disk. Default 7 days.
	StreamMaxAge time.Duration
	// StreamMaxBytes bounds the disk space of Stream. A full stream
	// refuses publishes (discard new); the ingester purges the oldest
	// settled messages once the stream passes 80% of it (streams.go).
	// Default 4 GiB.
	StreamMaxBytes int64
	// RejectedStream captures the dead letters rejected.<prefix>.* and
	// keeps them RejectedMaxAge. Default "TELEMETRY_REJECTED".
	RejectedStream string
	// RejectedMaxBytes bounds the disk space of RejectedStream; past it
	// the oldest dead letters are removed. Default 1 GiB.
	RejectedMaxBytes int64
	// RejectedMaxPerDevice bounds the dead letters RejectedStream keeps
	// per device; past it that device's oldest are removed. Default
	// 10000.
	RejectedMaxPerDevice int64
	// Consumer is the durable pull consumer on Stream. Default "ingest".
	Consumer string
	// Window is the accepted time window (retention and max future
	// skew). Default buckets.DefaultWindow; each zero half takes its
	// default.
	Window buckets.Window
	// MaxBatchReadings is how many readings one store commit gathers.
	// A single message with more readings is committed alone. Default
	// 5000.
	MaxBatchReadings int
	// MaxBatchWait is the longest a partial batch waits for more
	// messages before it is committed. Default 5ms.
	MaxBatchWait time.Duration
	// AckWait is how long the server waits for an ack before it
	// redelivers. Default 30s.
	AckWait time.Duration
	// MaxDeliver bounds the failed writes of one message: when its
	// write fails at this delivery or a later one, it goes to the dead
	// letter subject (max_deliveries). A failure of the store rather
	// than of the message (writeFailed, storeDown) never counts, and the
	// server delivers without a bound. Default 10.
	MaxDeliver int
	// BackOff is the delay before a message whose store write failed is
	// redelivered, indexed by delivery count (the last entry repeats).
	// The consumer's server-side back-off (redelivery after an ack
	// timeout) follows the same steps but never below AckWait, because
	// the server takes its first step as the ack wait. At most
	// MaxDeliver entries. Default 1s, 2s, 5s, 10s, 30s, 60s.
	BackOff []time.Duration
	// MaxAckPending bounds the messages delivered but not yet acked.
	// The consumer's own MaxAckPending starts lower and follows the
	// commit rate up to this (backpressure.go). Default 10000.
	MaxAckPending int

	// Hold, when set, is asked every HoldEvery whether intake must
	// pause: while it returns an error (such as a full disk) the
	// ingester stops consuming, so messages wait in the stream without
	// being delivered (their delivery count does not grow), and Ready
	// reports that error. Intake resumes by itself once Hold returns nil.
	Hold func() error
	// HoldEvery is how often Hold is asked. Default 1s.
	HoldEvery time.Duration
	// PaceEvery is how often the consumer's MaxAckPending is paced to
	// the commit rate (see backpressure.go). Default 1s.
	PaceEvery time.Duration
	// PullMaxBytes bounds the bytes of messages pulled from the server
	// and not yet handed to the batch loop; it is raised to twice the
	// server's max payload when smaller. Default 32 MiB.
	PullMaxBytes int
	// Positions, when set, keeps the stream sequence settled up to
	// (see replay.go), so that a consumer created anew starts after it
	// instead of replaying the whole stream. Nil: a new consumer
	// starts at the beginning of the stream.
	Positions Positions
	// Tombstones, when set, reports the days dropped from storage and
	// the devices deleted, so that readings of a dropped day or a
	// deleted device from messages published before the drop or delete
	// are skipped (counted with code day_dropped or device_deleted),
	// never written again.
	Tombstones Tombstones
	// PositionEvery is how often the settled position is saved while
	// it moves. Default 1s.
	PositionEvery time.Duration
	// Restored says that storage was just restored from a backup, so
	// its saved positions are the backup's: one of an earlier stream of
	// the same name (the stream the backup was taken against) is
	// expected, and reading the stream from its beginning is logged at
	// info instead of as a warning.
	Restored bool

	// Partitions, when positive, makes Stream partitioned (deploy/CLUSTER.md,
	// package partition): it is created with the partition subject
	// transform, and this Ingester consumes only partition Partition.
	// A stream partitioned into another count, or not at all, is
	// refused, and so is a partitioned stream when Partitions is 0.
	// Default 0: one consumer reads every device.
	Partitions int
	// Partition is the partition consumed, 0 to Partitions-1.
	Partition int
	// PartitionStreams (with Partitions) gives each partition a stream
	// of its own, named <Stream>_<partition> (partition.Stream), that
	// captures <prefix>.<partition>.* (partition.Subjects): the account
	// maps <prefix>.<device> there (partition.Mapping), so every
	// partition has its own file store, lock and fsync. Stream is then
	// the family's name; the Ingester reads its partition's stream
	// unfiltered. With MQTTCopies the partition's stream captures the
	// copies $MQTT.msgs.<prefix>.<partition>.* (the MQTT account maps
	// too).
	PartitionStreams bool
	// Intake (with PartitionStreams) says that the service's intake
	// (package ingest/intake) answers the devices' publishes: each
	// partition's stream captures IntakeSubject instead of
	// <prefix>.<partition>.*, stores it as <prefix>.<partition>.<device>
	// (IntakeTransform) and allows atomic batches; EnsureStream changes
	// an existing stream so (intakesubjects.go), and the Publisher
	// publishes there.
	Intake bool
	// family is Stream's family name once withDefaults resolved Stream
	// to the partition's own stream (PartitionStreams).
	family string
	// Existing says that Stream is only read, never created or
	// changed (a stream of an earlier layout being drained, which
	// another node may delete): once it is gone, Run returns an error
	// instead of creating it anew.
	Existing bool
	// Replicas is the replica count of the streams this Ingester
	// creates (an existing stream keeps its own). Default 1.
	Replicas int
	// Exclusive says the durable consumer is this process's alone (a
	// cluster node's consumer of one partition, named after the node).
	// At each set-up, deliveries still pending from before it (a
	// process killed before it acked them) are then redelivered at
	// once instead of after AckWait (see resetPending). Never set it
	// when several processes share the consumer.
	Exclusive bool

	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider defaults to the otel global.
	TracerProvider trace.TracerProvider
	// MeterProvider defaults to the otel global.
	MeterProvider metric.MeterProvider
	// Now is the clock of the accepted window and the lag metric.
	// Default time.Now.
	Now func() time.Time
}

// Family is the name of the stream family: Stream, or with
// PartitionStreams the name every partition's stream is built from.
func (c Config) Family() string {
	if c.family != "" {
		return c.family
	}
	return cmp.Or(c.Stream, DefaultConfig().Stream)
}

// ForPartition is c for partition p's ingester, its stream resolved
// (with PartitionStreams).
func (c Config) ForPartition(p int) Config {
	c.Stream, c.family, c.Partition = c.Family(), "", p
	return c.withDefaults()
}

// PerStream is the configuration of each readings stream of c: one per
// partition with PartitionStreams (ForPartition), else c itself.
func (c Config) PerStream() []Config {
	if !c.PartitionStreams {
		return []Config{c}
	}
	out := make([]Config, c.Partitions)
	for p := range out {
		out[p] = c.ForPartition(p)
	}
	return out
}

// Streams names every readings stream of c: one per partition with
// PartitionStreams, else Stream.
func (c Config) Streams() []string {
	if !c.PartitionStreams {
		return []string{cmp.Or(c.Stream, DefaultConfig().Stream)}
	}
	out := make([]string, c.Partitions)
	for p := range out {
		out[p] = partition.Stream(c.Family(), p)
	}
	return out
}

// DefaultSubjectPrefix is the default Config.SubjectPrefix.
const DefaultSubjectPrefix = "telemetry"

// Subjects are the subjects of c's prefix (DefaultSubjectPrefix when
// unset): device, dead letter and MQTT copy subjects are built there
// and nowhere else.
func (c Config) Subjects() topology.Subjects {
	return topology.For(cmp.Or(c.SubjectPrefix, DefaultSubjectPrefix))
}

// DefaultConfig returns the documented defaults. Logger, providers and
// clock stay nil and are resolved by New.
func DefaultConfig() Config {
	return Config{
		SubjectPrefix:        DefaultSubjectPrefix,
		Stream:               "TELEMETRY",
		StreamMaxAge:         7 * 24 * time.Hour,
		StreamMaxBytes:       4 << 30,
		RejectedMaxBytes:     1 << 30,
		RejectedMaxPerDevice: 10000,
		PullMaxBytes:         32 << 20,
		RejectedStream:       "TELEMETRY_REJECTED",
		Consumer:             "ingest",
		Window:               buckets.DefaultWindow,
		MaxBatchReadings:     5000,
		MaxBatchWait:         5 * time.Millisecond,
		AckWait:              30 * time.Second,
		MaxDeliver:           10,
		BackOff: []time.Duration{
			time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute,
		},
		MaxAckPending: 10000,
		PositionEvery: time.Second,
		PaceEvery:     time.Second,
		HoldEvery:     time.Second,
	}
}

// withDefaults fills zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	c.SubjectPrefix = cmp.Or(c.SubjectPrefix, d.SubjectPrefix)
	c.Stream = cmp.Or(c.Stream, d.Stream)
	c.StreamMaxAge = cmp.Or(c.StreamMaxAge, d.StreamMaxAge)
	c.StreamMaxBytes = cmp.Or(c.StreamMaxBytes, d.StreamMaxBytes)
	c.RejectedMaxBytes = cmp.Or(c.RejectedMaxBytes, d.RejectedMaxBytes)
	c.RejectedMaxPerDevice = cmp.Or(c.RejectedMaxPerDevice, d.RejectedMaxPerDevice)
	c.PullMaxBytes = cmp.Or(c.PullMaxBytes, d.PullMaxBytes)
	c.RejectedStream = cmp.Or(c.RejectedStream, d.RejectedStream)
	c.Consumer = cmp.Or(c.Consumer, d.Consumer)
	c.Window.Retention = cmp.Or(c.Window.Retention, d.Window.Retention)
	c.Window.MaxFutureSkew = cmp.Or(c.Window.MaxFutureSkew, d.Window.MaxFutureSkew)
	c.MaxBatchReadings = cmp.Or(c.MaxBatchReadings, d.MaxBatchReadings)
	c.MaxBatchWait = cmp.Or(c.MaxBatchWait, d.MaxBatchWait)
	c.AckWait = cmp.Or(c.AckWait, d.AckWait)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, d.MaxDeliver)
	c.MaxAckPending = cmp.Or(c.MaxAckPending, d.MaxAckPending)
	c.PositionEvery = cmp.Or(c.PositionEvery, d.PositionEvery)
	c.PaceEvery = cmp.Or(c.PaceEvery, d.PaceEvery)
	c.HoldEvery = cmp.Or(c.HoldEvery, d.HoldEvery)
	if len(c.BackOff) == 0 {
		c.BackOff = d.BackOff
	}
	if c.PartitionStreams && c.family == "" {
		c.family, c.Stream = c.Stream, partition.Stream(c.Stream, c.Partition)
	}
	c.BackOff = append([]time.Duration(nil), c.BackOff...)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate reports the first setting that cannot work.
func (c Config) validate() error {
	if err := ValidateSubjectPrefix(c.SubjectPrefix); err != nil {
		return err
	}
	for _, name := range []string{c.Stream, c.RejectedStream, c.Consumer} {
		if strings.ContainsAny(name, " \t\r\n.*>/\\") {
			return fmt.Errorf("stream or consumer name %q: must not contain whitespace, '.', '*', '>' or slashes", name)
		}
	}
	if c.Stream == c.RejectedStream {
		return errors.New("stream and rejected stream must differ")
	}
	switch {
	case c.Window.Retention < 0 || c.Window.MaxFutureSkew < 0:
		return errors.New("window durations must be positive")
	case c.MaxBatchReadings < 0, c.MaxBatchWait < 0, c.AckWait < 0, c.StreamMaxAge < 0:
		return errors.New("batch size, batch wait, ack wait and stream max age must be positive")
	case c.StreamMaxBytes < 0, c.RejectedMaxBytes < 0, c.PullMaxBytes < 0, c.RejectedMaxPerDevice < 0:
		return errors.New("stream max bytes, rejected stream max bytes, rejected max per device and pull max bytes must be positive")
	case c.MaxDeliver < 1:
		return fmt.Errorf("max deliver %d: must be at least 1", c.MaxDeliver)
	case len(c.BackOff) > c.MaxDeliver:
		return fmt.Errorf("%d back-off steps for max deliver %d: at most one step per delivery", len(c.BackOff), c.MaxDeliver)
	case c.MaxAckPending < 1:
		return fmt.Errorf("max ack pending %d: must be at least 1", c.MaxAckPending)
	}
	if err := c.validatePartitions(); err != nil {
		return err
	}
	for _, b := range c.BackOff {
		if b <= 0 {
			return fmt.Errorf("back-off step %s: must be positive", b)
		}
	}
	return nil
}

// serverBackOff is the consumer's BackOff: the configured steps, each
// at least AckWait (the server uses the first step as the ack wait).
func (c Config) serverBackOff() []time.Duration {
	out := make([]time.Duration, len(c.BackOff))
	for i, b := range c.BackOff {
		out[i] = max(b, c.AckWait)
	}
	return out
}

// nakDelay is the redelivery delay after the given (1-based) delivery
// failed.
func (c Config) nakDelay(delivered uint64) time.Duration {
	i := int(min(delivered, uint64(len(c.BackOff)))) - 1
	return c.BackOff[max(i, 0)]
}

// ValidateSubjectPrefix checks a subject prefix: devices publish on
// <prefix>.<device>, so it must be a literal NATS subject of one or more
// dot-separated tokens ("telemetry", "site1.telemetry") without
// whitespace or wildcards. It is the one rule for the prefix; the
// service's -subject-prefix flag is checked with it.
func ValidateSubjectPrefix(prefix string) error {
	if !validSubject(prefix) {
		return fmt.Errorf("subject prefix %q: want dot-separated tokens without spaces or wildcards", prefix)
	}
	return nil
}

// validSubject reports whether s is a literal NATS subject: non-empty
// dot-separated tokens without whitespace or wildcards.
func validSubject(s string) bool {
	if s == "" {
		return false
	}
	for tok := range strings.SplitSeq(s, ".") {
		if !validToken(tok) {
			return false
		}
	}
	return true
}

// validToken reports whether s can be one literal subject token.
func validToken(s string) bool {
	if s == "" || s == "*" || s == ">" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f || c == '.' || c == '*' || c == '>' {
			return false
		}
	}
	return true
}
