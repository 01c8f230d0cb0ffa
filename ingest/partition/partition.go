// Package partition maps devices to the partitions of the telemetry
// stream when several telemetryd nodes share a NATS JetStream cluster
// (deploy/CLUSTER.md).
//
// A device belongs to partition FNV-1a-32(device ID) mod N. The stream
// applies the mapping itself, as a subject transform: devices keep
// publishing to <prefix>.<device> (and MQTT <prefix>/<device>), and the
// stream stores each message under <prefix>.<partition>.<device>, using
// the server's own partition(N, 1) function. A consumer of one
// partition filters on <prefix>.<partition>.>. Of computes the same
// function in the process, so that queries find the owners of a device
// without asking the server; a test checks the two agree.
package partition

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest/topology"
)

// Max is the largest partition count accepted. Each partition costs a
// durable consumer per copy; past a few hundred the consumers, not the
// devices, become the load.
const Max = 1024

// Validate checks a partition count: 1 to Max.
func Validate(n int) error {
	if n < 1 || n > Max {
		return fmt.Errorf("partitions %d: want 1 to %d", n, Max)
	}
	return nil
}

// Of returns the partition of device among n (n >= 1): FNV-1a (32 bit)
// of the device ID modulo n, the function of the NATS subject mapping
// partition(n, 1).
func Of(n int, device string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(device))
	return int(h.Sum32() % uint32(n))
}

// Transform is the stream subject transform that stores a message
// published on <prefix>.<device> under <prefix>.<partition>.<device>.
func Transform(prefix string, n int) jetstream.SubjectTransformConfig {
	return jetstream.SubjectTransformConfig{
		Source:      topology.For(prefix).All(),
		Destination: fmt.Sprintf("%s.{{partition(%d,1)}}.{{wildcard(1)}}", prefix, n),
	}
}

// Filter is the consumer filter of partition p: every stored subject of
// it, including a device token that is not a valid device (delivered so
// it is dead-lettered rather than left unread).
func Filter(prefix string, p int) string {
	return prefix + "." + strconv.Itoa(p) + ".>"
}

// ErrNotPartitioned is returned by Count for a stream without the
// partition transform of the prefix.
var ErrNotPartitioned = errors.New("stream is not partitioned")

// Count returns the partition count of a stream's subject transform for
// prefix, or ErrNotPartitioned when it has none (any other transform is
// an error naming it; the caller knows the other transforms it sets).
func Count(prefix string, t *jetstream.SubjectTransformConfig) (int, error) {
	if t == nil || (t.Source == "" && t.Destination == "") {
		return 0, ErrNotPartitioned
	}
	head := prefix + ".{{partition("
	rest, ok := strings.CutPrefix(t.Destination, head)
	if t.Source != topology.For(prefix).All() || !ok {
		return 0, fmt.Errorf("stream has the subject transform %s -> %s, not the partitioning of %s.*", t.Source, t.Destination, prefix)
	}
	num, tail, ok := strings.Cut(rest, ",1)}}.{{wildcard(1)}}")
	n, err := strconv.Atoi(num)
	if !ok || tail != "" || err != nil || Validate(n) != nil {
		return 0, fmt.Errorf("stream has the subject transform %s -> %s, not the partitioning of %s.*", t.Source, t.Destination, prefix)
	}
	return n, nil
}

// DeviceToken returns the device token of a stored subject
// <prefix>.<partition>.<device> ("" when the subject has another form).
func DeviceToken(prefix, subject string) string {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return ""
	}
	num, dev, ok := strings.Cut(rest, ".")
	if !ok {
		return ""
	}
	if _, err := strconv.Atoi(num); err != nil {
		return ""
	}
	return dev
}

// Stream is the name of partition p's stream in the family of stream
// streams ("TELEMETRY" -> "TELEMETRY_3"): with a stream per partition,
// each has its own file store, lock and fsync.
func Stream(family string, p int) string { return family + "_" + strconv.Itoa(p) }

// Subjects is what partition p's own stream captures: every stored
// subject <prefix>.<p>.<device> of the partition.
func Subjects(prefix string, p int) string { return prefix + "." + strconv.Itoa(p) + ".*" }

// Mapping is the account subject mapping that sends a publish on
// <prefix>.<device> to <prefix>.<partition>.<device>, where the stream
// of that partition captures it. The embedded server adds it to the
// service's and the MQTT account; an external server needs it in its
// configuration (mappings { "<source>": "<destination>" }).
func Mapping(prefix string, n int) (source, destination string) {
	t := Transform(prefix, n)
	return t.Source, t.Destination
}
