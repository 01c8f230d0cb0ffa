package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest"
)

// The embedded server's MQTT listener keeps its state in streams named
// $MQTT_*. They stay small for a fleet that only publishes:
//
//   - $MQTT_sess: one message per client ID with a session;
//   - $MQTT_msgs: the QoS 1/2 store of MQTT subscriptions (interest
//     retention: empty without MQTT subscribers);
//   - $MQTT_rmsgs: one retained message per topic published with the
//     retain flag;
//   - $MQTT_qos2in, $MQTT_out: QoS 2 packets between PUBREC and PUBCOMP.
//
// The server acknowledges a QoS 1 PUBLISH once it has stored the
// message on $MQTT.msgs.<subject>. The telemetry stream captures
// $MQTT.msgs.<prefix>.* itself (ingest.Config.ExtraSubjects), so that
// store lands in TELEMETRY right behind the message the device
// published on <prefix>.<device>: one stream, one in-order ingest
// queue, so the PUBACK is sent only once the reading's message is
// persisted. The store copies have done their job once stored: the
// ingester's consumer (unfiltered, so the server serves it without
// matching subjects) acks them on delivery without reading them, and
// they are purged every mqttMarkerPurgeEvery.
const (
	mqttMsgsStream       = "$MQTT_msgs"
	mqttMsgsPrefix       = "$MQTT.msgs."
	mqttMarkerPurgeEvery = 30 * time.Second
	mqttSetupTimeout     = 10 * time.Second
)

// mqttStoreSubject is the subject of the server's QoS 1 store copies of
// device publishes.
func mqttStoreSubject(prefix string) string { return mqttMsgsPrefix + prefix + ".*" }

// ensureMQTTMsgsStream creates (or narrows) $MQTT_msgs so that it does
// not capture $MQTT.msgs.<prefix>.*, which the telemetry stream takes.
// It runs before the ingester sets up its stream; when an MQTT client
// connected first, the server has created $MQTT_msgs with $MQTT.msgs.>
// and this narrows it.
func ensureMQTTMsgsStream(ctx context.Context, js jetstream.JetStream) error {
	ctx, cancel := context.WithTimeout(ctx, mqttSetupTimeout)
	defer cancel()
	want := jetstream.StreamConfig{
		Name:        mqttMsgsStream,
		Description: "MQTT QoS 1/2 deliveries to MQTT subscribers (device readings go to the telemetry stream)",
		Subjects:    []string{mqttMsgsStream},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.InterestPolicy,
		MaxAge:      time.Hour,
		MaxBytes:    64 << 20,
	}
	st, err := js.Stream(ctx, mqttMsgsStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, err = js.CreateStream(ctx, want); err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create stream %s: %w", mqttMsgsStream, err)
		}
		st, err = js.Stream(ctx, mqttMsgsStream)
	}
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", mqttMsgsStream, err)
	}
	cfg := st.CachedInfo().Config
	if len(cfg.Subjects) == 1 && cfg.Subjects[0] == mqttMsgsStream {
		return nil
	}
	cfg.Subjects = want.Subjects
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("narrow stream %s: %w", mqttMsgsStream, err)
	}
	return nil
}

// purgeMQTTMarkers removes the store copies of MQTT publishes from the
// telemetry stream every mqttMarkerPurgeEvery until ctx is done.
func purgeMQTTMarkers(ctx context.Context, js jetstream.JetStream, stream, prefix string, log *slog.Logger) {
	t := time.NewTicker(mqttMarkerPurgeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, mqttSetupTimeout)
		st, err := js.Stream(pctx, stream)
		if err == nil {
			err = st.Purge(pctx, jetstream.WithPurgeSubject(mqttStoreSubject(prefix)))
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("purge of MQTT store copies failed; retried later", "stream", stream, "error", err)
		}
	}
}

// startMQTT prepares the streams behind the embedded MQTT listener and
// starts the purge of store copies. Without the listener it does
// nothing (with -nats-url, MQTT is the external server's job).
func (m *Main) startMQTT() error {
	if m.mqttPort == 0 {
		if m.cfg.NATSURL != "" && m.cfg.MQTTListen != "" {
			m.log.Info("mqtt listener not started: with -nats-url, MQTT is the NATS server's job")
		}
		return nil
	}
	js, err := jetstream.New(m.nc)
	if err != nil {
		return fmt.Errorf("mqtt: jetstream: %w", err)
	}
	if err := ensureMQTTMsgsStream(context.Background(), js); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancelMQTT = cancel
	stream := ingest.DefaultConfig().Stream
	log := m.log.With("component", "mqtt")
	m.wg.Go(func() { purgeMQTTMarkers(ctx, js, stream, m.cfg.SubjectPrefix, log) })
	return nil
}

// MQTTAddr is the embedded MQTT listener's address, empty when it is
// off.
func (m *Main) MQTTAddr() string {
	if m.ns == nil || m.cfg.MQTTListen == "" || m.mqttPort == 0 {
		return ""
	}
	host, _, _ := net.SplitHostPort(m.cfg.MQTTListen)
	return net.JoinHostPort(host, strconv.Itoa(m.mqttPort))
}
