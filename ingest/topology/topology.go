// Package topology names the NATS subjects and message headers of the
// telemetry front door, so that every package asks one place instead of
// building the strings itself:
//
//   - devices publish on <prefix>.<device> (MQTT topic <prefix>/<device>);
//   - a message that is not stored is republished as a dead letter on
//     rejected.<prefix>.<device> (rejected.<prefix>._invalid when its
//     device token is unusable), with the headers HeaderErrorCode and
//     HeaderError;
//   - the embedded MQTT listener stores a copy of each QoS 1 publish on
//     $MQTT.msgs.<prefix>.<device>; the telemetry stream captures those
//     copies and keeps each as <prefix>.<device> (MQTTCopiesTransform).
//
// The streams and the consumer are configured by package ingest from
// these names; the embedded server and its MQTT account live in package
// ingest/natsembed.
package topology

import (
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Headers of dead letters.
const (
	// HeaderErrorCode carries the buckets.Code of the rejection.
	HeaderErrorCode = "Telemetry-Error-Code"
	// HeaderError carries the human-readable reason; it names the
	// reading index (or line) and the field.
	HeaderError = "Telemetry-Error"
	// HeaderStreamSeq carries the sequence of the original message in
	// the telemetry stream.
	HeaderStreamSeq = "Telemetry-Stream-Seq"
)

// InvalidDeviceToken replaces, in a dead letter's subject, a device
// token that cannot be a subject token or a device ID.
const InvalidDeviceToken = "_invalid"

// rejectedRoot is the first token of every dead letter subject.
const rejectedRoot = "rejected"

// mqttCopiesRoot is where the embedded MQTT listener stores the copies
// of QoS 1 publishes (nats-server's $MQTT.msgs.<subject>).
const mqttCopiesRoot = "$MQTT.msgs"

// Subjects are the subjects of one subject prefix.
type Subjects struct {
	// Prefix is the subject prefix ("telemetry", "site1.telemetry").
	Prefix string
}

// For returns the subjects of prefix.
func For(prefix string) Subjects { return Subjects{Prefix: prefix} }

// Device is <prefix>.<device>, where device publishes its readings.
func (s Subjects) Device(device string) string { return s.Prefix + "." + device }

// DeviceToken is the device token of subject <prefix>.<device> (the
// rest of the subject after the prefix); "" when subject does not
// start with the prefix.
func (s Subjects) DeviceToken(subject string) string {
	tok, ok := strings.CutPrefix(subject, s.Prefix+".")
	if !ok {
		return ""
	}
	return tok
}

// All is <prefix>.*, every device's subject.
func (s Subjects) All() string { return s.Prefix + ".*" }

// Rejected is rejected.<prefix>.<token>, the dead letter subject of a
// message of device token token (InvalidDeviceToken when it has none).
func (s Subjects) Rejected(token string) string { return rejectedRoot + "." + s.Prefix + "." + token }

// RejectedAll is rejected.<prefix>.*, every dead letter subject.
func (s Subjects) RejectedAll() string { return s.Rejected("*") }

// IsRejected reports whether subject is a dead letter subject (of any
// prefix).
func IsRejected(subject string) bool { return strings.HasPrefix(subject, rejectedRoot+".") }

// MQTTCopies is $MQTT.msgs.<prefix>.*, the subjects of the embedded MQTT
// listener's store copies of QoS 1 device publishes.
func (s Subjects) MQTTCopies() string { return mqttCopiesRoot + "." + s.All() }

// MQTTCopiesTransform is the telemetry stream's subject transform that
// keeps each MQTT store copy $MQTT.msgs.<prefix>.<device> as
// <prefix>.<device>, so the copy is the reading's message.
func (s Subjects) MQTTCopiesTransform() jetstream.SubjectTransformConfig {
	return jetstream.SubjectTransformConfig{Source: s.MQTTCopies(), Destination: s.Prefix + ".{{wildcard(1)}}"}
}

// IsMQTTCopiesTransform reports whether t is MQTTCopiesTransform (not a
// partitioning).
func (s Subjects) IsMQTTCopiesTransform(t *jetstream.SubjectTransformConfig) bool {
	return t != nil && *t == s.MQTTCopiesTransform()
}

// MQTTPartitionCopies is $MQTT.msgs.<prefix>.*.*: the store copies of
// QoS 1 publishes when the MQTT account maps <prefix>.<device> to
// <prefix>.<partition>.<device> (a stream per partition).
func (s Subjects) MQTTPartitionCopies() string { return mqttCopiesRoot + "." + s.Prefix + ".*.*" }

// MQTTCopiesOfTransform is the subject transform of partition stream
// part (its stored subjects <prefix>.<part>.*) that keeps each MQTT
// store copy $MQTT.msgs.<prefix>.<part>.<device> as
// <prefix>.<part>.<device>.
func (s Subjects) MQTTCopiesOfTransform(part string) jetstream.SubjectTransformConfig {
	return jetstream.SubjectTransformConfig{Source: mqttCopiesRoot + "." + s.Prefix + "." + part + ".*",
		Destination: s.Prefix + "." + part + ".{{wildcard(1)}}"}
}
