package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest/partition"
)

// The service's intake (Config.Intake, package ingest/intake) answers
// the devices' publishes on <prefix>.<device> itself and stores them in
// the partition's stream as atomic batches, so that one fsync covers a
// batch. The partition streams then capture only subjects no device
// publishes to, or a device's publish would have two responders (the
// stream and the intake) and be stored twice:
//
//   - IntakeSubject, $TELEMETRYD.in.<prefix>.<partition>.<device>,
//     where the intake and the line protocol door publish;
//   - the MQTT listener's store copies $MQTT.msgs.<prefix>.<partition>.*
//     (Config.MQTTCopies), whose store the PUBACK waits for, as before.
//
// One subject transform of the stream (IntakeTransform) stores both as
// <prefix>.<partition>.<device>, the subject every reader of the
// streams knows, so that messages stored before and after the change
// read alike.

// intakeRoot is the first two tokens of IntakeSubject: two, as
// $MQTT.msgs has, so that one transform serves both.
const intakeRoot = "$TELEMETRYD.in"

// IntakeSubject is the subject on which device's readings reach the
// stream of partition p when the intake runs.
func IntakeSubject(prefix string, p int, device string) string {
	return intakeRoot + "." + prefix + "." + strconv.Itoa(p) + "." + device
}

// intakeSubjects is what partition p's stream captures from the intake.
func intakeSubjects(prefix string, p int) string { return IntakeSubject(prefix, p, "*") }

// IntakeTransform is the subject transform of partition p's stream with
// the intake: both $TELEMETRYD.in.<prefix>.<p>.<device> and
// $MQTT.msgs.<prefix>.<p>.<device> are stored as
// <prefix>.<p>.<device>.
func IntakeTransform(prefix string, p int) jetstream.SubjectTransformConfig {
	return jetstream.SubjectTransformConfig{
		Source:      "*.*." + partition.Subjects(prefix, p),
		Destination: prefix + "." + strconv.Itoa(p) + ".{{wildcard(3)}}",
	}
}

// intakeStreamConfig changes sc, partition c.Partition's stream, to the
// intake's subjects.
func (c Config) intakeStreamConfig(sc jetstream.StreamConfig) jetstream.StreamConfig {
	in := intakeSubjects(c.SubjectPrefix, c.Partition)
	sc.Description = "Device readings of partition " + strconv.Itoa(c.Partition) + ", published by the service on " + in
	sc.Subjects = []string{in}
	t := IntakeTransform(c.SubjectPrefix, c.Partition)
	sc.SubjectTransform = &t
	// The intake's batches.
	sc.AllowAtomicPublish = true
	return sc
}

// toIntake updates an existing stream of c (Intake) that still captures
// the devices' subjects <prefix>.<partition>.* (an earlier version, or
// a run without the intake): it captures the intake's subjects instead
// and stores them under the same subjects as before. Messages it holds
// stay as they are, under the subjects every reader knows, so nothing
// is lost or read twice; a publish that arrives while no responder
// listens (before the intake subscribes) gets no ack and is sent again
// by its client.
func toIntake(ctx context.Context, js jetstream.JetStream, st jetstream.Stream, c Config, log *slog.Logger) (jetstream.Stream, error) {
	cfg := st.CachedInfo().Config
	want := streamConfig(c)
	old := partition.Subjects(c.SubjectPrefix, c.Partition)
	t := cfg.SubjectTransform
	if !slices.Contains(cfg.Subjects, old) && t != nil && *t == *want.SubjectTransform {
		return st, nil
	}
	cfg.Subjects = slices.DeleteFunc(cfg.Subjects, func(s string) bool { return s == old })
	for _, s := range want.Subjects {
		if !slices.Contains(cfg.Subjects, s) {
			cfg.Subjects = append(cfg.Subjects, s)
		}
	}
	cfg.SubjectTransform = want.SubjectTransform
	cfg.AllowAtomicPublish = true
	st, err := js.UpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("stream %s: capture the intake's subjects: %w", c.Stream, err)
	}
	log.Info("stream captures the intake's subjects; devices' publishes are answered by the intake", "stream", c.Stream, "subjects", cfg.Subjects)
	return st, nil
}
