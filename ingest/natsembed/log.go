package natsembed

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/telemetryd/telemetryd/ingest"
)

// natsLogger forwards the server's log to slog. Until the server has
// started, its first fatal message goes to fatal instead, so that a
// server that cannot start fails the start at once (and is reported
// once, by whoever handles that error). Permission violations go to
// denied (counted, sampled), and an MQTT client's violation closes its
// connection (disconnect); other warnings and errors pass through
// sampler, so clients cannot flood the log. An error of one MQTT
// client's connection (a refused store, a protocol mistake) is that
// client's, logged at WARN: the service has no MQTT connection of its
// own. A refused login is logged by denied alone.
type natsLogger struct {
	l          *slog.Logger
	fatal      chan string
	started    *atomic.Bool
	denied     *deniedReporter
	sampler    *ingest.LogSampler
	disconnect func(cid uint64)
	onError    func(msg string) // sees every error line (writefault.go)
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
	line := fmt.Sprintf(format, v...)
	if n.onError != nil {
		n.onError(line)
	}
	if level, msg, ok := classifyNATSError(line); ok {
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

// clientLine matches the server's log lines about one client
// connection: "127.0.0.1:46212 - cid:22 - ..." (NATS) or
// "127.0.0.1:46212 - mid:20 - ..." (MQTT).
var clientLine = regexp.MustCompile(`^\S+ - [a-z]{3}:\d+ - `)

// mqtt5Hint is added to the server's line about an MQTT client that
// asked for another protocol version (most often MQTT 5).
const mqtt5Hint = "; this listener speaks MQTT 3.1.1 (protocol level 4): set the client to MQTT 3.1.1"

// classifyNATSError says how to log an error line of the server. A
// line about one client is that client's mistake (a bad login, an MQTT
// version the server does not speak, a malformed protocol line), not
// the service's: it is logged at WARN. A refused login is reported,
// counted and sampled where it is refused (deviceAuth's
// deniedReporter), so the server's own lines about it are dropped (log
// false) and each refusal is logged once.
func classifyNATSError(msg string) (level slog.Level, line string, log bool) {
	if !clientLine.MatchString(msg) {
		return slog.LevelError, msg, true
	}
	if strings.Contains(msg, "authentication error") {
		return 0, "", false
	}
	if strings.Contains(msg, "unacceptable protocol version") {
		msg += mqtt5Hint
	}
	return slog.LevelWarn, msg, true
}
