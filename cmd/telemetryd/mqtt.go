package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest"
)

// MQTT clients of the embedded server live in an account of their own,
// mqttAccountName, so that a reading published over MQTT is stored in
// the telemetry stream once:
//
//   - the server handles a QoS 1 PUBLISH by publishing the message on
//     <prefix>.<device> in the client's account, then storing a copy on
//     $MQTT.msgs.<prefix>.<device> and sending the PUBACK once JetStream
//     acknowledges that store. The service's account imports the copies
//     (and the MQTT account the acknowledgements, on $MQTT.JSA.>); the
//     telemetry stream captures $MQTT.msgs.<prefix>.* and stores each
//     copy as <prefix>.<device> (a subject transform), so the copy is the
//     reading's message and the PUBACK means it is persisted there;
//   - a QoS 0 PUBLISH has no copy: its message on <prefix>.<device>
//     reaches the service's forwarder (a subscription in the MQTT
//     account), which publishes the QoS 0 ones into the telemetry
//     stream and drops the others (their copy is already on its way).
//
// The server keeps its MQTT state in the MQTT account's streams $MQTT_*:
// $MQTT_sess (one message per client ID with a session), $MQTT_msgs
// (QoS 1/2 deliveries to MQTT subscribers; created here so that it does
// not capture the device copies, which go to the telemetry stream),
// $MQTT_rmsgs (one retained message per topic published with the
// retain flag), $MQTT_qos2in and $MQTT_out (QoS 2 packets between
// PUBREC and PUBCOMP). MQTT logins are refused until all of this is set
// up.
const (
	mqttAccountName  = "MQTT"
	mqttAdminUser    = "$telemetryd-mqtt" // the service's connection to the MQTT account
	mqttMsgsStream   = "$MQTT_msgs"
	mqttMsgsPrefix   = "$MQTT.msgs."
	mqttAcksSubject  = "$MQTT.JSA.>" // the MQTT listener's JetStream replies
	mqttQoSHeader    = "Nmqtt-Pub"   // the server's header of an MQTT publish: its QoS
	mqttSetupTimeout = 10 * time.Second
	// mqttForwardPending bounds the QoS 0 forwarder's queue (messages);
	// past it the server drops QoS 0 readings, as MQTT allows.
	mqttForwardPending = 1 << 16
)

// mqttStoreSubject is the subject of the server's QoS 1 store copies of
// device publishes, in the MQTT account.
func mqttStoreSubject(prefix string) string { return mqttMsgsPrefix + prefix + ".*" }

// mqttDoor is the state the embedded server's authentication shares
// with the MQTT setup: the MQTT account, and whether MQTT clients may
// log in yet.
type mqttDoor struct {
	acc    atomic.Pointer[server.Account]
	ready  atomic.Bool
	secret string // mqttAdminUser's password, random per process
	admin  *nats.Conn
}

// configure wraps the server's authentication (or its absence) so that
// MQTT clients are put in the MQTT account.
func (d *mqttDoor) configure(o *server.Options) *natsLogger {
	o.CustomClientAuthentication = &mqttAuth{next: o.CustomClientAuthentication, door: d}
	return nil
}

// mqttAuth puts MQTT clients in the MQTT account and lets the service's
// MQTT connection in; every other login is next's to judge (with no
// next, everyone is let in, as without authentication).
type mqttAuth struct {
	next server.Authentication
	door *mqttDoor
}

// Check authenticates one client connection.
func (a *mqttAuth) Check(c server.ClientAuthentication) bool {
	acc := a.door.acc.Load()
	if !isMQTTClient(c) {
		if o := c.GetOpts(); o.Username == mqttAdminUser {
			if acc == nil || !equalSecret(o.Password, a.door.secret) {
				return false
			}
			c.RegisterUser(&server.User{Username: mqttAdminUser, Account: acc})
			return true
		}
		return a.next == nil || a.next.Check(c)
	}
	if !a.door.ready.Load() {
		return false // starting: the client retries
	}
	in := inAccount{ClientAuthentication: c, acc: acc}
	if a.next == nil {
		in.RegisterUser(&server.User{Username: c.GetOpts().Username})
		return true
	}
	return a.next.Check(in)
}

// inAccount registers the user it authenticates in acc.
type inAccount struct {
	server.ClientAuthentication
	acc *server.Account
}

func (c inAccount) RegisterUser(u *server.User) {
	u.Account = c.acc
	c.ClientAuthentication.RegisterUser(u)
}

// isMQTTClient tells an MQTT connection from a NATS one. The server
// names its connections "<addr> - cid:<n>" (NATS), "- wid:" (websocket)
// and "- mid:" (MQTT) in its logs and monitoring; this is the one place
// its client kind is visible to an authenticator.
func isMQTTClient(c server.ClientAuthentication) bool {
	s, ok := c.(fmt.Stringer)
	return ok && strings.Contains(s.String(), " - mid")
}

// setupMQTTAccount creates the MQTT account with JetStream, the import
// of device copies into the service's account and the import of their
// acknowledgements back. It runs once the embedded server is up, before
// any MQTT login is accepted.
func setupMQTTAccount(ns *server.Server, prefix string) (*server.Account, error) {
	acc, err := ns.RegisterAccount(mqttAccountName)
	if errors.Is(err, server.ErrAccountExists) {
		acc, err = ns.LookupAccount(mqttAccountName)
	}
	if err != nil {
		return nil, fmt.Errorf("mqtt account: %w", err)
	}
	unlimited := server.JetStreamAccountLimits{MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxConsumers: -1,
		MaxAckPending: -1, MemoryMaxStreamBytes: -1, StoreMaxStreamBytes: -1}
	if !acc.JetStreamEnabled() {
		if err := acc.EnableJetStream(map[string]server.JetStreamAccountLimits{"": unlimited}, nil); err != nil {
			return nil, fmt.Errorf("mqtt account: jetstream: %w", err)
		}
	}
	gacc, copies := ns.GlobalAccount(), mqttStoreSubject(prefix)
	for _, step := range []struct {
		what string
		err  func() error
	}{
		{"export " + copies, func() error { return acc.AddStreamExport(copies, []*server.Account{gacc}) }},
		{"import " + copies, func() error { return gacc.AddStreamImport(acc, copies, "") }},
		{"export " + mqttAcksSubject, func() error { return gacc.AddStreamExport(mqttAcksSubject, []*server.Account{acc}) }},
		{"import " + mqttAcksSubject, func() error { return acc.AddStreamImport(gacc, mqttAcksSubject, "") }},
	} {
		if err := step.err(); err != nil && !errors.Is(err, server.ErrStreamImportDuplicate) {
			return nil, fmt.Errorf("mqtt account: %s: %w", step.what, err)
		}
	}
	return acc, nil
}

// The server's MQTT streams in the MQTT account. The server has no
// option for their limits and creates them unbounded when the first
// MQTT client connects, unless they exist; the service creates them
// first (as the server would, with the same names, subjects and
// retention), or updates them, each bounded to maxBytes with discard
// new, before any MQTT login is accepted. A full one refuses the store
// behind a PUBACK, PUBREC or PUBCOMP, so the server closes that
// client's connection; the client reconnects and sends again.
// $MQTT_msgs is narrowed as well (see mqttMsgsStreamConfig).
func mqttStreamConfigs(maxBytes int64) []jetstream.StreamConfig {
	bounded := func(c jetstream.StreamConfig) jetstream.StreamConfig {
		c.Storage, c.MaxBytes, c.Discard = jetstream.FileStorage, maxBytes, jetstream.DiscardNew
		return c
	}
	return []jetstream.StreamConfig{
		bounded(jetstream.StreamConfig{Name: "$MQTT_sess", Subjects: []string{"$MQTT.sess.>"},
			Retention: jetstream.LimitsPolicy, MaxMsgsPerSubject: 1}),
		bounded(mqttMsgsStreamConfig()),
		bounded(jetstream.StreamConfig{Name: mqttQoS2InStream, Subjects: []string{"$MQTT.qos2.in.>"},
			Retention: jetstream.LimitsPolicy, MaxMsgsPerSubject: 1, DiscardNewPerSubject: true}),
		bounded(jetstream.StreamConfig{Name: "$MQTT_out", Subjects: []string{"$MQTT.out.>"},
			Retention: jetstream.InterestPolicy}),
		bounded(jetstream.StreamConfig{Name: "$MQTT_rmsgs", Subjects: []string{"$MQTT.rmsgs.>"},
			Retention: jetstream.LimitsPolicy, MaxMsgsPerSubject: 1}),
	}
}

// mqttQoS2InStream holds QoS 2 PUBLISHes between PUBREC and PUBREL.
const mqttQoS2InStream = "$MQTT_qos2in"

// mqttMsgsStreamConfig is $MQTT_msgs narrowed so that it does not
// capture $MQTT.msgs.<prefix>.*: those copies go to the telemetry
// stream through the import, and a second store here would answer the
// PUBACK first.
func mqttMsgsStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        mqttMsgsStream,
		Description: "MQTT QoS 1/2 deliveries to MQTT subscribers (device readings go to the telemetry stream)",
		Subjects:    []string{mqttMsgsStream},
		Retention:   jetstream.InterestPolicy,
		MaxAge:      time.Hour,
	}
}

// ensureMQTTStreams creates or updates the MQTT account's streams
// (mqttStreamConfigs). An existing stream keeps its other settings;
// its subjects are set only for $MQTT_msgs (narrowed).
func ensureMQTTStreams(ctx context.Context, js jetstream.JetStream, maxBytes int64) error {
	ctx, cancel := context.WithTimeout(ctx, mqttSetupTimeout)
	defer cancel()
	for _, want := range mqttStreamConfigs(maxBytes) {
		st, err := js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if _, err = js.CreateStream(ctx, want); err == nil {
				continue
			}
			if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				return fmt.Errorf("create stream %s: %w", want.Name, err)
			}
			st, err = js.Stream(ctx, want.Name)
		}
		if err != nil {
			return fmt.Errorf("look up stream %s: %w", want.Name, err)
		}
		cfg := st.CachedInfo().Config
		narrow := want.Name == mqttMsgsStream && !slices.Equal(cfg.Subjects, want.Subjects)
		if cfg.MaxBytes == want.MaxBytes && cfg.Discard == want.Discard && !narrow {
			continue
		}
		cfg.MaxBytes, cfg.Discard = want.MaxBytes, want.Discard
		if narrow {
			cfg.Subjects = want.Subjects
		}
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("bound stream %s: %w", want.Name, err)
		}
	}
	return nil
}

// captureStoreCopies makes the telemetry stream capture the MQTT
// listener's store copies and keep each as <prefix>.<device>. A missing
// stream is created first as the ingester creates it (icfg). The
// stream's subscription to the copies is made anew here, after the
// import exists (the server lets an import reach only subscriptions
// made after it). Copies an earlier version kept under their own
// subject (stored right behind their readings, never read) are purged,
// once: a stream that already has the transform holds none, and a
// filtered purge of a large stream is not free at every start.
func captureStoreCopies(ctx context.Context, js jetstream.JetStream, icfg ingest.Config, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, mqttSetupTimeout)
	defer cancel()
	stream, prefix := icfg.Stream, icfg.SubjectPrefix
	copies := mqttStoreSubject(prefix)
	transform := &jetstream.SubjectTransformConfig{Source: copies, Destination: prefix + ".{{wildcard(1)}}"}
	st, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = ingest.EnsureStream(ctx, js, icfg, log)
	}
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", stream, err)
	}
	cfg := st.CachedInfo().Config
	if slices.Contains(cfg.Subjects, copies) {
		if cfg.SubjectTransform == nil { // kept by an earlier version, untransformed
			if err := st.Purge(ctx, jetstream.WithPurgeSubject(copies)); err != nil {
				return fmt.Errorf("purge %s from stream %s: %w", copies, stream, err)
			}
		}
		cfg.Subjects = slices.DeleteFunc(cfg.Subjects, func(s string) bool { return s == copies })
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("stream %s without %s: %w", stream, copies, err)
		}
	}
	cfg.Subjects = append(cfg.Subjects, copies)
	cfg.SubjectTransform = transform
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("stream %s with %s: %w", stream, copies, err)
	}
	return nil
}

// qos0Forwarder publishes the QoS 0 MQTT publishes it receives into
// the service's account (the telemetry stream); the others have their
// copy stored there by the server already. QoS 0 is at most once: a
// reading that cannot be forwarded is dropped, and said so in the log,
// sampled (while the service's connection is down, every one fails
// alike).
type qos0Forwarder struct {
	out     msgPublisher
	log     *slog.Logger
	sampler ingest.LogSampler
}

// msgPublisher is what the forwarder needs of the service's connection.
type msgPublisher interface {
	PublishMsg(*nats.Msg) error
}

func newQoS0Forwarder(out msgPublisher, log *slog.Logger) *qos0Forwarder {
	return &qos0Forwarder{out: out, log: log, sampler: ingest.LogSampler{Burst: 10, Interval: 10 * time.Second}}
}

// forward handles one MQTT publish.
func (f *qos0Forwarder) forward(msg *nats.Msg) {
	if q := msg.Header.Get(mqttQoSHeader); q != "" && q[0] != '0' {
		return
	}
	err := f.out.PublishMsg(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data})
	if err == nil {
		return
	}
	if ok, held := f.sampler.Allow(time.Now()); ok {
		f.log.Warn("QoS 0 MQTT reading dropped: not forwarded", "subject", msg.Subject, "error", err, "lines_dropped_before", held)
	}
}

// asyncError logs the errors of the forwarder's connection: above all
// a slow consumer, when the server dropped QoS 0 readings the forwarder
// did not take in time (nats.go reports it once per episode).
func (f *qos0Forwarder) asyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if sub == nil {
		f.log.Warn("nats async error", "error", err)
		return
	}
	if errors.Is(err, nats.ErrSlowConsumer) {
		dropped, _ := sub.Dropped()
		f.log.Warn("QoS 0 MQTT readings dropped: the forwarder fell behind", "subject", sub.Subject, "dropped_so_far", dropped)
		return
	}
	f.log.Warn("nats async error", "subject", sub.Subject, "error", err)
}

// startMQTT sets up the MQTT account behind the embedded MQTT listener
// and then lets MQTT clients in. Without the listener it only reports
// (with -nats-url, MQTT is the external server's job).
func (m *Main) startMQTT() error {
	if m.mqttPort == 0 {
		if m.cfg.NATSURL != "" && m.cfg.MQTTListen != "" {
			m.log.Info("mqtt listener not started: with -nats-url, MQTT is the NATS server's job")
		}
		return nil
	}
	prefix := m.cfg.SubjectPrefix
	acc, err := setupMQTTAccount(m.ns, prefix)
	if err != nil {
		return err
	}
	m.mqtt.acc.Store(acc)
	ctx := context.Background()
	js, err := jetstream.New(m.nc)
	if err != nil {
		return fmt.Errorf("mqtt: jetstream: %w", err)
	}
	if err := captureStoreCopies(ctx, js, m.ingestConfig(), m.log.With("component", "mqtt")); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	fwd := newQoS0Forwarder(m.nc, m.log.With("component", "mqtt"))
	admin, err := nats.Connect(m.ns.ClientURL(), append(m.sec.natsClientOptions(true),
		nats.Name("telemetryd-mqtt"), nats.UserInfo(mqttAdminUser, m.mqtt.secret), nats.MaxReconnects(-1),
		nats.ErrorHandler(fwd.asyncError))...)
	if err != nil {
		return fmt.Errorf("mqtt: connect to account %s: %w", mqttAccountName, err)
	}
	m.mqtt.admin = admin
	ajs, err := jetstream.New(admin)
	if err != nil {
		return fmt.Errorf("mqtt: jetstream: %w", err)
	}
	if err := ensureMQTTStreams(ctx, ajs, m.cfg.MQTTStreamMaxBytes); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	sub, err := admin.Subscribe(prefix+".*", fwd.forward)
	if err != nil {
		return fmt.Errorf("mqtt: subscribe %s.*: %w", prefix, err)
	}
	if err := sub.SetPendingLimits(mqttForwardPending, -1); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	if err := admin.Flush(); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	m.mqtt.ready.Store(true)
	return nil
}

// closeMQTT stops the QoS 0 forwarder, after the last MQTT reading it
// received was handed on.
func (m *Main) closeMQTT() {
	if m.mqtt != nil && m.mqtt.admin != nil {
		m.mqtt.ready.Store(false)
		_ = m.mqtt.admin.Drain()
		for deadline := time.Now().Add(mqttSetupTimeout); m.mqtt.admin.IsDraining() && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		m.mqtt.admin.Close()
	}
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
