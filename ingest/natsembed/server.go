// Package natsembed runs telemetryd's embedded NATS server: JetStream,
// the MQTT 3.1.1 listener with the account its clients live in, and the
// authentication of devices (user = device ID, password = its secret,
// publish only to its own subject); and the service's own client
// connections (Dial), to it or to an external server, whose max_payload
// they check (CheckMaxPayload). The subjects it serves are named by
// package ingest/topology; the telemetry stream is configured by package
// ingest.
package natsembed

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// Defaults of Config.
const (
	// DefaultListen is the usual client listener: NATS's port, on
	// loopback.
	DefaultListen = "127.0.0.1:4222"
	// DefaultMQTTListen is the usual MQTT listener: MQTT's port, on
	// loopback.
	DefaultMQTTListen = "127.0.0.1:1883"
	// DefaultMaxPayload is the largest message the server accepts:
	// batches of up to 10,000 readings need more than NATS's 1 MiB
	// default. An external server needs at least as much.
	DefaultMaxPayload = 8 << 20
	// DefaultMQTTStreamMaxBytes bounds each of the MQTT listener's
	// streams ($MQTT_*).
	DefaultMQTTStreamMaxBytes = 64 << 20
	// readyTimeout bounds the server's start.
	readyTimeout = 10 * time.Second
	// deniedLogInterval is the sampling interval of denial log lines and
	// of the server's own warnings.
	deniedLogInterval = 10 * time.Second
)

// Config configures the embedded server. A zero field takes its
// default.
type Config struct {
	// Listen is the client listener, host:port; port 0 or -1 picks a
	// free one.
	Listen string
	// MQTTListen is the MQTT listener, host:port; empty: off.
	MQTTListen string
	// StoreDir holds the JetStream streams.
	StoreDir string
	// SyncAlways makes JetStream fsync every write.
	SyncAlways bool
	// SyncInterval, without SyncAlways, bounds how long an acked message
	// may wait for its fsync (0: the server's default, 2 minutes).
	// JetStream is given half of it (jetStreamSyncInterval): its timer
	// restarts only after a sync, which on a busy disk takes a while
	// itself, so syncing every interval would leave more than an
	// interval between two syncs.
	SyncInterval time.Duration
	// MaxPayload bounds one message. Default DefaultMaxPayload.
	MaxPayload int32
	// MaxConn bounds the client connections (0: the server's default).
	MaxConn int
	// JetStreamMaxMemory bounds JetStream's memory (0: the server's
	// default).
	JetStreamMaxMemory int64
	// TLS, when set, serves TLS on the client and MQTT listeners; the
	// service's own connection pins its certificate (ClientOptions).
	TLS *tls.Config
	// Devices, when set, authenticates every client as a device (and
	// the service's own connection with an internal credential); nil
	// lets every client in. It is asked at each login, so a reloaded
	// credential set applies to the next one.
	Devices func() Devices
	// SubjectPrefix: devices publish on <prefix>.<device>. Default
	// ingest.DefaultSubjectPrefix.
	SubjectPrefix string
	// Partitions, when positive, maps every publish on <prefix>.<device>
	// to <prefix>.<partition>.<device> (partition.Mapping), in the
	// service's account and the MQTT account, where the stream of that
	// partition captures it (ingest.Config.PartitionStreams).
	Partitions int
	// MQTTStreamMaxBytes bounds each of the MQTT listener's streams.
	// Default DefaultMQTTStreamMaxBytes.
	MQTTStreamMaxBytes int64
	// Logger receives the server's log; default slog.Default().
	Logger *slog.Logger
	// MeterProvider counts refused logins (telemetry.auth.denied);
	// default the otel global.
	MeterProvider metric.MeterProvider
}

// Devices are the device credentials the server checks logins against
// (an *auth.Set is one).
type Devices interface {
	// Device reports whether secret is device id's.
	Device(id, secret string) bool
	// PublishAs lists the further devices id may publish for ("*":
	// every device).
	PublishAs(id string) []string
}

// Server is a running embedded server.
type Server struct {
	ns       *server.Server
	cfg      Config
	log      *slog.Logger
	internal string // password of the service's own connection
	mqttPort int    // 0 when the MQTT listener is off
	mqtt     *mqttDoor
	faults   *writeFaults           // JetStream write errors to recover from (writefault.go)
	jsConfig server.JetStreamConfig // what JetStream started with, to start it again
	stop     chan struct{}          // ends watchWriteFaults and syncMetadata
	watched  chan struct{}          // closed when both returned
}

// Start runs the server and returns once it accepts connections. A
// listener that cannot bind fails it at once with the server's reason.
func Start(cfg Config) (*Server, error) {
	cfg.MaxPayload = cmp.Or(cfg.MaxPayload, DefaultMaxPayload)
	cfg.SubjectPrefix = cmp.Or(cfg.SubjectPrefix, ingest.DefaultSubjectPrefix)
	cfg.MQTTStreamMaxBytes = cmp.Or(cfg.MQTTStreamMaxBytes, DefaultMQTTStreamMaxBytes)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	host, port, err := SplitListen(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: listen: %w", err)
	}
	opts := &server.Options{
		ServerName:         "telemetryd",
		Host:               host,
		Port:               port,
		JetStream:          true,
		JetStreamMaxMemory: cfg.JetStreamMaxMemory,
		StoreDir:           cfg.StoreDir,
		SyncAlways:         cfg.SyncAlways,
		SyncInterval:       jetStreamSyncInterval(cfg.SyncInterval),
		NoSigs:             true,
		MaxPayload:         cfg.MaxPayload,
		MaxConn:            cfg.MaxConn,
	}
	if cfg.MQTTListen != "" {
		// MQTT needs JetStream and a server name, both set above.
		if opts.MQTT.Host, opts.MQTT.Port, err = SplitListen(cfg.MQTTListen); err != nil {
			return nil, fmt.Errorf("embedded nats: mqtt listen: %w", err)
		}
	}
	if cfg.TLS != nil {
		opts.TLSConfig, opts.TLS, opts.TLSTimeout = cfg.TLS.Clone(), true, 5
		opts.MQTT.TLSConfig, opts.MQTT.TLSTimeout = cfg.TLS.Clone(), 5
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	if s.internal, err = newSecret(); err != nil {
		return nil, err
	}
	denied, err := newDeniedReporter(cfg.MeterProvider.Meter("github.com/telemetryd/telemetryd/ingest/natsembed"),
		cfg.Logger.With("component", "auth"), deniedLogInterval)
	if err != nil {
		return nil, err
	}
	if cfg.Devices != nil {
		opts.CustomClientAuthentication = &deviceAuth{devices: cfg.Devices, prefix: cfg.SubjectPrefix,
			partitions: cfg.Partitions, internal: s.internal, denied: denied}
	}
	if cfg.MQTTListen != "" {
		secret, err := newSecret()
		if err != nil {
			return nil, err
		}
		s.mqtt = &mqttDoor{secret: secret}
		// Wraps the authentication set above.
		opts.CustomClientAuthentication = &mqttAuth{next: opts.CustomClientAuthentication, door: s.mqtt}
	}
	logger := &natsLogger{l: cfg.Logger.With("component", "nats"), denied: denied,
		sampler: &ingest.LogSampler{Burst: 20, Interval: deniedLogInterval},
		fatal:   make(chan string, 1), started: new(atomic.Bool)}
	s.faults = &writeFaults{}
	logger.onError = s.faults.noteLog
	s.jsConfig = server.JetStreamConfig{StoreDir: opts.StoreDir, SyncInterval: opts.SyncInterval, SyncAlways: opts.SyncAlways,
		Strict: !opts.NoJetStreamStrict, MaxMemory: opts.JetStreamMaxMemory, MaxStore: opts.JetStreamMaxStore, CompressOK: true}
	if opts.StoreDir != "" {
		if _, err := repairStreamSums(opts.StoreDir, logger.l); err != nil { // metarepair.go
			logger.l.Warn("checking the streams' metadata checksums failed; the server skips a stream whose checksum does not match", "dir", opts.StoreDir, "err", err)
		}
		if _, err := removeBrokenConsumers(opts.StoreDir, logger.l); err != nil { // metarepair.go
			logger.l.Warn("checking the consumers' metadata failed; the server skips a consumer whose metadata is incomplete", "dir", opts.StoreDir, "err", err)
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	s.ns = ns
	if s.mqtt != nil {
		s.mqtt.isMQTT = s.isMQTTClient
	}
	if err := s.mapPartitions(ns.GlobalAccount()); err != nil {
		return nil, err
	}
	logger.disconnect = disconnectOnce(ns)
	ns.SetLoggerV2(logger, false, false, false)
	ns.Start()
	// A listener that cannot bind (a busy port) is reported through
	// Fatalf at once; fail then instead of waiting out the timeout.
	deadline := time.Now().Add(readyTimeout)
	for !ns.ReadyForConnections(20 * time.Millisecond) {
		select {
		case msg := <-logger.fatal:
			ns.Shutdown()
			return nil, fmt.Errorf("embedded nats (listen %s, mqtt listen %q): %s", cfg.Listen, cfg.MQTTListen, msg)
		default:
		}
		if time.Now().After(deadline) {
			ns.Shutdown()
			return nil, fmt.Errorf("embedded nats (listen %s, mqtt listen %q): not ready after %s", cfg.Listen, cfg.MQTTListen, readyTimeout)
		}
	}
	logger.started.Store(true)
	s.stop, s.watched = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.watched)
		if cfg.SyncAlways || cfg.SyncInterval <= 0 {
			s.watchWriteFaults(s.stop)
			return
		}
		var wg sync.WaitGroup
		wg.Go(func() { s.syncMetadata(s.stop, cfg.SyncInterval) }) // metasync.go
		s.watchWriteFaults(s.stop)
		wg.Wait()
	}()
	// The server writes the port it picked back into its options.
	s.mqttPort = max(opts.MQTT.Port, 0)
	return s, nil
}

// jetStreamSyncInterval is the sync interval JetStream is given for a
// Config.SyncInterval of every (see there).
func jetStreamSyncInterval(every time.Duration) time.Duration {
	if every <= 0 {
		return every
	}
	return max(every/2, time.Millisecond)
}

// mapPartitions adds the partition mapping (Config.Partitions) to acc.
func (s *Server) mapPartitions(acc *server.Account) error {
	if s.cfg.Partitions <= 0 {
		return nil
	}
	src, dst := partition.Mapping(s.cfg.SubjectPrefix, s.cfg.Partitions)
	if err := acc.AddMapping(src, dst); err != nil {
		return fmt.Errorf("embedded nats: account %s: map %s to %s: %w", acc.Name, src, dst, err)
	}
	return nil
}

// SplitListen parses a host:port listen address; port 0 or -1 picks a
// free port.
func SplitListen(listen string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return "", 0, fmt.Errorf("%q: port: %w", listen, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// NATS is the running nats-server.
func (s *Server) NATS() *server.Server { return s.ns }

// ClientURL is the URL the service connects to.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// MQTTAddr is the MQTT listener's address, empty when it is off.
func (s *Server) MQTTAddr() string {
	if s.mqttPort == 0 {
		return ""
	}
	host, _, _ := net.SplitHostPort(s.cfg.MQTTListen)
	return net.JoinHostPort(host, strconv.Itoa(s.mqttPort))
}

// ClientOptions are the options of the service's own connections: the
// internal credential (with Devices), an inbox prefix devices may not
// subscribe to, and TLS pinned to the server's certificate.
func (s *Server) ClientOptions() []nats.Option {
	// Devices share the server: the service's replies and pulled
	// messages go to an inbox prefix they may not subscribe to.
	opts := []nats.Option{nats.CustomInboxPrefix(ServiceInboxPrefix)}
	if s.cfg.Devices != nil {
		opts = append(opts, nats.UserInfo(InternalUser, s.internal))
	}
	if s.cfg.TLS != nil {
		opts = append(opts, nats.Secure(pinnedTLS(s.cfg.TLS)))
	}
	return opts
}

// Shutdown stops the server and waits for it; call StopMQTT first.
func (s *Server) Shutdown() {
	if s.stop != nil {
		close(s.stop)
		<-s.watched
		s.stop = nil
	}
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// pinnedTLS trusts exactly the certificate the server serves: the
// service's own connection needs no CA and no host name.
func pinnedTLS(c *tls.Config) *tls.Config {
	leaf := c.Certificates[0].Certificate[0]
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by the pin below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], leaf) {
				return errors.New("embedded nats presented another certificate than the configured one")
			}
			return nil
		},
	}
}

// newSecret is a random password for one of the service's own
// connections, new at every start and never written down.
func newSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("embedded nats: secret: %w", err)
	}
	return hex.EncodeToString(b), nil
}
