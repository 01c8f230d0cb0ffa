package natsembed

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/nats-io/nats.go"
)

// Dial opens one of the service's connections to url (the embedded
// server's ClientURL, or an external server): it reconnects for ever,
// logs disconnects, reconnects and asynchronous errors, and runs
// onConnect at its first connect and at every reconnect. opts carry
// its credentials and TLS (ClientOptions for the embedded server).
func Dial(url, name string, log *slog.Logger, opts []nats.Option, onConnect ...func(*nats.Conn)) (*nats.Conn, error) {
	log = log.With("component", "nats", "connection", name)
	connected := func(c *nats.Conn) {
		for _, fn := range onConnect {
			fn(c)
		}
	}
	nc, err := nats.Connect(url, append(opts,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: our own Close
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ConnectHandler(connected), // the first connect, at once or after a failed first try
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("nats reconnected", "url", c.ConnectedUrlRedacted())
			connected(c)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
			subj := ""
			if s != nil {
				subj = s.Subject
			}
			log.Warn("nats async error", "subject", subj, "err", err)
		}))...)
	if err != nil {
		return nil, fmt.Errorf("connect nats %s: %w", url, err)
	}
	return nc, nil
}

// CheckMaxPayload returns an onConnect check for Dial that warns when
// the server connected to accepts smaller messages than the embedded
// server does (DefaultMaxPayload): devices' batches of up to 10,000
// readings, and the dead letters that repeat them, would be refused.
// Give it to one connection to an external server; it checks at every
// reconnect, as another server of a cluster may be configured
// otherwise.
func CheckMaxPayload(log *slog.Logger) func(*nats.Conn) {
	return func(c *nats.Conn) {
		if mp := c.MaxPayload(); mp > 0 && mp < DefaultMaxPayload {
			log.Warn("the NATS server's max_payload is below what telemetryd publishes: batches of up to 10,000 readings and their dead letters are refused; set max_payload: 8MiB in its configuration (deploy/nats-cluster.conf)",
				"server", c.ConnectedServerName(), "max_payload", humanize.IBytes(uint64(mp)),
				"want", humanize.IBytes(DefaultMaxPayload))
		}
	}
}
