package natsembed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest"
)

// MQTT clients of the server live in an account of their own,
// MQTTAccount, so that a reading published over MQTT is stored in the
// telemetry stream once:
//
//   - the server handles a QoS 1 PUBLISH by publishing the message on
//     <prefix>.<device> in the client's account, then storing a copy on
//     $MQTT.msgs.<prefix>.<device> and sending the PUBACK once JetStream
//     acknowledges that store. The service's account imports the copies
//     (and the MQTT account the acknowledgements, on $MQTT.JSA.>); the
//     telemetry stream captures the copies and stores each as
//     <prefix>.<device> (topology.Subjects.MQTTCopiesTransform), so the
//     copy is the reading's message and the PUBACK means it is persisted
//     there;
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
	// MQTTAccount is the account of MQTT clients.
	MQTTAccount = "MQTT"
	// MQTTQoSHeader is the server's header of an MQTT publish: its QoS.
	MQTTQoSHeader = "Nmqtt-Pub"
	// MQTTQoS2InStream holds QoS 2 PUBLISHes between PUBREC and PUBREL.
	MQTTQoS2InStream = "$MQTT_qos2in"

	MQTTMsgsStream   = "$MQTT_msgs"  // QoS 1/2 deliveries to MQTT subscribers
	mqttAcksSubject  = "$MQTT.JSA.>" // the MQTT listener's JetStream replies
	mqttSetupTimeout = 10 * time.Second
	// mqttForwardPending bounds the QoS 0 forwarder's queue (messages);
	// past it the server drops QoS 0 readings, as MQTT allows.
	mqttForwardPending = 1 << 16
	// mqttClientType is the type nats-server's connection info gives an
	// MQTT client (server.ConnInfo.Type).
	mqttClientType = "mqtt"
)

// mqttDoor is the state the server's authentication shares with the
// MQTT set-up: the MQTT account, and whether MQTT clients may log in
// yet.
type mqttDoor struct {
	acc    atomic.Pointer[server.Account]
	ready  atomic.Bool
	secret string // MQTTAdminUser's password, random per process
	admin  *nats.Conn
	isMQTT func(server.ClientAuthentication) bool
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
	if !a.door.isMQTT(c) {
		if o := c.GetOpts(); o.Username == MQTTAdminUser {
			if acc == nil || !equalSecret(o.Password, a.door.secret) {
				return false
			}
			c.RegisterUser(&server.User{Username: MQTTAdminUser, Account: acc})
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

// isMQTTClient tells an MQTT connection from a NATS one by the
// server's connection info (its client type), looked up by the
// connection's ID. A client that named its library in its CONNECT
// (every NATS client library does; MQTT has no such field) is a NATS
// one without the look-up, which copies the server's client list.
func (s *Server) isMQTTClient(c server.ClientAuthentication) bool {
	if o := c.GetOpts(); o.Lang != "" || o.Version != "" {
		return false
	}
	cz, err := s.ns.Connz(&server.ConnzOptions{CID: c.GetID()})
	return err == nil && len(cz.Conns) == 1 && cz.Conns[0].Type == mqttClientType
}

// setupMQTTAccount creates the MQTT account with JetStream, the import
// of device copies into the service's account and the import of their
// acknowledgements back. It runs once the server is up, before any MQTT
// login is accepted.
func setupMQTTAccount(ns *server.Server, copies string) (*server.Account, error) {
	acc, err := ns.RegisterAccount(MQTTAccount)
	if errors.Is(err, server.ErrAccountExists) {
		acc, err = ns.LookupAccount(MQTTAccount)
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
	gacc := ns.GlobalAccount()
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
// MQTT client connects, unless they exist; they are created first (as
// the server would, with the same names, subjects and retention), or
// updated, each bounded to maxBytes with discard new, before any MQTT
// login is accepted. A full one refuses the store behind a PUBACK,
// PUBREC or PUBCOMP, so the server closes that client's connection; the
// client reconnects and sends again. $MQTT_msgs is narrowed as well
// (see mqttMsgsStreamConfig).
func mqttStreamConfigs(maxBytes int64) []jetstream.StreamConfig {
	bounded := func(c jetstream.StreamConfig) jetstream.StreamConfig {
		c.Storage, c.MaxBytes, c.Discard = jetstream.FileStorage, maxBytes, jetstream.DiscardNew
		return c
	}
	return []jetstream.StreamConfig{
		bounded(jetstream.StreamConfig{Name: "$MQTT_sess", Subjects: []string{"$MQTT.sess.>"},
			Retention: jetstream.LimitsPolicy, MaxMsgsPerSubject: 1}),
		bounded(mqttMsgsStreamConfig()),
		bounded(jetstream.StreamConfig{Name: MQTTQoS2InStream, Subjects: []string{"$MQTT.qos2.in.>"},
			Retention: jetstream.LimitsPolicy, MaxMsgsPerSubject: 1, DiscardNewPerSubject: true}),
		bounded(jetstream.StreamConfig{Name: "$MQTT_out", Subjects: []string{"$MQTT.out.>"},
			Retention: jetstream.InterestPolicy}),
		bounded(jetstream.StreamConfig{Name: "$MQTT_rmsgs", Subjects: []string{"$MQTT.rmsgs.>"},
			Retention: jetstream.LimitsPolicy, MaxMsgsPerSubject: 1}),
	}
}

// mqttMsgsStreamConfig is $MQTT_msgs narrowed so that it does not
// capture $MQTT.msgs.<prefix>.*: those copies go to the telemetry
// stream through the import, and a second store here would answer the
// PUBACK first.
func mqttMsgsStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        MQTTMsgsStream,
		Description: "MQTT QoS 1/2 deliveries to MQTT subscribers (device readings go to the telemetry stream)",
		Subjects:    []string{MQTTMsgsStream},
		Retention:   jetstream.InterestPolicy,
		MaxAge:      time.Hour,
	}
}

// ensureMQTTStreams creates or updates the MQTT account's streams
// (mqttStreamConfigs). An existing stream keeps its other settings;
// its subjects are set only for $MQTT_msgs (narrowed).
func ensureMQTTStreams(ctx context.Context, js jetstream.JetStream, maxBytes int64) error {
	ctx, cancel := setupContext(ctx)
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
		narrow := want.Name == MQTTMsgsStream && !slices.Equal(cfg.Subjects, want.Subjects)
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
	if q := msg.Header.Get(MQTTQoSHeader); q != "" && q[0] != '0' {
		return
	}
	err := f.out.PublishMsg(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data})
	if err == nil {
		return
	}
	if ok, held := f.sampler.Allow(time.Now()); ok {
		f.log.Warn("QoS 0 MQTT reading dropped: not forwarded", "subject", msg.Subject, "err", err, "lines_dropped_before", held)
	}
}

// asyncError logs the errors of the forwarder's connection: above all
// a slow consumer, when the server dropped QoS 0 readings the forwarder
// did not take in time (nats.go reports it once per episode).
func (f *qos0Forwarder) asyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if sub == nil {
		f.log.Warn("nats async error", "err", err)
		return
	}
	if errors.Is(err, nats.ErrSlowConsumer) {
		dropped, _ := sub.Dropped()
		f.log.Warn("QoS 0 MQTT readings dropped: the forwarder fell behind", "subject", sub.Subject, "dropped_so_far", dropped)
		return
	}
	f.log.Warn("nats async error", "subject", sub.Subject, "err", err)
}

// StartMQTT sets up the MQTT account behind the MQTT listener, makes
// the telemetry stream of icfg capture the MQTT store copies
// (ingest.CaptureMQTTCopies), starts the QoS 0 forwarder publishing on
// service (the service's own connection) and then lets MQTT clients
// in. Without the listener it does nothing.
func (s *Server) StartMQTT(ctx context.Context, service *nats.Conn, icfg ingest.Config) error {
	if s.mqtt == nil {
		return nil
	}
	log := s.log.With("component", "mqtt")
	icfg.MQTTCopies = true
	subjects := icfg.Subjects()
	copies, devices := subjects.MQTTCopies(), subjects.All()
	if icfg.PartitionStreams != (s.cfg.Partitions > 0) || (icfg.PartitionStreams && icfg.Partitions != s.cfg.Partitions) {
		return fmt.Errorf("mqtt: the server maps devices to %d partitions, the streams are of %d", s.cfg.Partitions, icfg.Partitions)
	}
	if icfg.PartitionStreams {
		// The MQTT account maps <prefix>.<device> to its partition too,
		// so the copies are $MQTT.msgs.<prefix>.<partition>.<device>
		// and QoS 0 publishes arrive on <prefix>.<partition>.<device>.
		copies, devices = subjects.MQTTPartitionCopies(), subjects.Prefix+".*.*"
	}
	acc, err := setupMQTTAccount(s.ns, copies)
	if err != nil {
		return err
	}
	if err := s.mapPartitions(acc); err != nil {
		return err
	}
	s.mqtt.acc.Store(acc)
	js, err := jetstream.New(service)
	if err != nil {
		return fmt.Errorf("mqtt: jetstream: %w", err)
	}
	cctx, cancel := setupContext(ctx)
	defer cancel()
	if err := ingest.CaptureMQTTCopies(cctx, js, icfg, log); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	fwd := newQoS0Forwarder(service, log)
	admin, err := nats.Connect(s.ns.ClientURL(), append(s.ClientOptions(),
		nats.Name("telemetryd-mqtt"), nats.UserInfo(MQTTAdminUser, s.mqtt.secret), nats.MaxReconnects(-1),
		nats.ErrorHandler(fwd.asyncError))...)
	if err != nil {
		return fmt.Errorf("mqtt: connect to account %s: %w", MQTTAccount, err)
	}
	s.mqtt.admin = admin
	ajs, err := jetstream.New(admin)
	if err != nil {
		return fmt.Errorf("mqtt: jetstream: %w", err)
	}
	if err := ensureMQTTStreams(ctx, ajs, s.cfg.MQTTStreamMaxBytes); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	sub, err := admin.Subscribe(devices, fwd.forward)
	if err != nil {
		return fmt.Errorf("mqtt: subscribe %s: %w", devices, err)
	}
	if err := sub.SetPendingLimits(mqttForwardPending, -1); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	if err := admin.Flush(); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	s.mqtt.ready.Store(true)
	return nil
}

// MQTTForwarder is the QoS 0 forwarder's connection (nil before
// StartMQTT or without the listener).
func (s *Server) MQTTForwarder() *nats.Conn {
	if s.mqtt == nil {
		return nil
	}
	return s.mqtt.admin
}

// StopMQTT refuses new MQTT logins and stops the QoS 0 forwarder,
// after the last MQTT reading it received was handed on.
func (s *Server) StopMQTT() {
	if s.mqtt == nil || s.mqtt.admin == nil {
		return
	}
	s.mqtt.ready.Store(false)
	_ = s.mqtt.admin.Drain()
	for deadline := time.Now().Add(mqttSetupTimeout); s.mqtt.admin.IsDraining() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	s.mqtt.admin.Close()
}

// setupContext bounds a step of the MQTT set-up by the caller's
// deadline, or by mqttSetupTimeout when the caller sets none: a start
// that may take its time on a loaded machine says so with a deadline.
func setupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, mqttSetupTimeout)
}
