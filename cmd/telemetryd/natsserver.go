package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/telemetryd/telemetryd/ingest"
)

// startEmbeddedNATS runs an in-process NATS server with JetStream,
// storing streams under <dataDir>/nats. With syncAlways JetStream
// fsyncs every write, matching -sync-writes. A non-empty mqttListen
// also opens the server's MQTT 3.1.1 listener there.
// mqttPort is the MQTT listener's actual port (0 when off).
//
// configure, if given, adjusts the options (authentication, TLS,
// connection limits) and may return the sampling logger to use.
func startEmbeddedNATS(listen, mqttListen, dataDir string, syncAlways bool, log *slog.Logger,
	configure ...func(*server.Options) *natsLogger) (ns *server.Server, mqttPort int, err error) {
	host, port, err := splitListen("-nats-listen", listen)
	if err != nil {
		return nil, 0, err
	}
	opts := &server.Options{
		ServerName: "telemetryd",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(dataDir, "nats"),
		SyncAlways: syncAlways,
		NoSigs:     true,
		// Batches of up to 10,000 readings need more than the 1 MiB default.
		MaxPayload: 8 << 20,
	}
	if mqttListen != "" {
		// MQTT needs JetStream and a server name, both set above.
		if opts.MQTT.Host, opts.MQTT.Port, err = splitListen("-mqtt-listen", mqttListen); err != nil {
			return nil, 0, err
		}
	}
	logger := &natsLogger{l: log.With("component", "nats")}
	for _, c := range configure {
		if l := c(opts); l != nil {
			logger = l
		}
	}
	logger.fatal, logger.started = make(chan string, 1), new(atomic.Bool)
	ns, err = server.NewServer(opts)
	if err != nil {
		return nil, 0, fmt.Errorf("embedded nats: %w", err)
	}
	logger.disconnect = disconnectOnce(ns)
	ns.SetLoggerV2(logger, false, false, false)
	ns.Start()
	// A listener that cannot bind (a busy port) is reported through
	// Fatalf at once; fail then instead of waiting out the timeout.
	deadline := time.Now().Add(natsReadyTimeout)
	for !ns.ReadyForConnections(20 * time.Millisecond) {
		select {
		case msg := <-logger.fatal:
			ns.Shutdown()
			return nil, 0, fmt.Errorf("embedded nats (-nats-listen %s, -mqtt-listen %q): %s", listen, mqttListen, msg)
		default:
		}
		if time.Now().After(deadline) {
			ns.Shutdown()
			return nil, 0, fmt.Errorf("embedded nats (-nats-listen %s, -mqtt-listen %q): not ready after %s", listen, mqttListen, natsReadyTimeout)
		}
	}
	logger.started.Store(true)
	// The server writes the port it picked back into its options.
	return ns, max(opts.MQTT.Port, 0), nil
}

// splitListen parses a host:port listen address; port 0 or -1 picks a
// free port.
func splitListen(flag, listen string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: %w", flag, listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: port: %w", flag, listen, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// natsReadyTimeout bounds the embedded server's start.
const natsReadyTimeout = 10 * time.Second

// natsLogger forwards the embedded server's log to slog. Until the
// server has started, its first fatal message goes to fatal instead, so
// that a server that cannot start fails the start at once (and is
// reported once, by whoever handles that error). Permission violations
// go to denied (counted, sampled), and an MQTT client's violation
// closes its connection (disconnect); other warnings and errors pass
// through sampler when set, so clients cannot flood the log. An error
// of one MQTT client's connection (a refused store, a protocol
// mistake) is that client's, logged at WARN: the service has no MQTT
// connection of its own. A refused login is logged by denied alone.
type natsLogger struct {
	l          *slog.Logger
	fatal      chan string
	started    *atomic.Bool
	denied     *deniedReporter
	sampler    *ingest.LogSampler
	disconnect func(cid uint64)
}

func (n *natsLogger) Noticef(format string, v ...any) { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Warnf(format string, v ...any) {
	n.sampled(slog.LevelWarn, fmt.Sprintf(format, v...))
}
func (n *natsLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if !n.started.Load() {
		select {
		case n.fatal <- msg:
			return
		default:
		}
	}
	n.l.Error(msg)
}
func (n *natsLogger) Errorf(format string, v ...any) {
	if level, msg, ok := classifyNATSError(fmt.Sprintf(format, v...)); ok {
		n.sampled(level, msg)
	}
}
func (n *natsLogger) Debugf(format string, v ...any) { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Tracef(format string, v ...any) {}

func (n *natsLogger) sampled(level slog.Level, msg string) {
	if n.denied != nil && n.denied.violation(msg) {
		// MQTT 3.1.1 cannot refuse a PUBLISH but by closing the
		// connection; the server has already acknowledged and dropped
		// it (as the protocol allows), so the device learns of its
		// mistake by the closed connection.
		if cid, ok := mqttConnID(msg); ok && n.disconnect != nil {
			n.disconnect(cid)
		}
		return
	}
	if n.sampler != nil {
		ok, held := n.sampler.Allow(time.Now())
		if !ok {
			return
		}
		if held > 0 {
			n.l.Log(context.Background(), level, msg, "lines_dropped_before", held)
			return
		}
	}
	n.l.Log(context.Background(), level, msg)
}

// mqttConnRE finds the connection ID in the server's log lines about
// an MQTT client ("<addr> - mid:<id> - ...").
var mqttConnRE = regexp.MustCompile(` - mid:(\d+) - `)

// mqttConnID is the connection ID of the MQTT client a log line is
// about; false when it is about none.
func mqttConnID(line string) (uint64, bool) {
	m := mqttConnRE.FindStringSubmatch(line)
	if m == nil {
		return 0, false
	}
	id, err := strconv.ParseUint(m[1], 10, 64)
	return id, err == nil
}

// disconnectOnce returns a function that closes a client connection of
// ns, at most one close in flight per connection. The server logs
// while holding its own locks, so the close runs on a goroutine of its
// own, which ends as soon as the connection is closed.
func disconnectOnce(ns *server.Server) func(cid uint64) {
	var closing sync.Map
	return func(cid uint64) {
		if _, busy := closing.LoadOrStore(cid, struct{}{}); busy {
			return
		}
		go func() {
			defer closing.Delete(cid)
			_ = ns.DisconnectClientByID(cid) // already gone: nothing to do
		}()
	}
}
