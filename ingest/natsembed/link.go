package natsembed

import (
	"log/slog"

	"github.com/nats-io/nats.go"
)

// LinkConfig says which NATS server OpenLink links the service to.
type LinkConfig struct {
	// URL is an external server's; empty starts the embedded server.
	URL string
	// Embedded is the embedded server's configuration, asked only
	// when URL is empty.
	Embedded func() Config
	// Started, if set, runs once the embedded server has started,
	// before the first connection.
	Started func(*Server)
	// External are the connection options (credentials, TLS) of an
	// external server, asked at every Dial; nil means none.
	External func() []nats.Option
	// Logger logs the connections' events.
	Logger *slog.Logger
}

// Link is the service's way to its NATS server: the embedded Server,
// or the external server at URL.
type Link struct {
	// Server is the embedded server; nil for an external one.
	Server *Server
	// URL is what the service's connections dial.
	URL string
	cfg LinkConfig
}

// OpenLink starts the embedded server unless cfg.URL is set, then
// opens the service's main connection, named name, with Dial. On a
// connection to an external server, CheckMaxPayload warns at every
// connect of a too small max_payload.
func OpenLink(cfg LinkConfig, name string) (*Link, *nats.Conn, error) {
	l := &Link{URL: cfg.URL, cfg: cfg}
	var onConnect []func(*nats.Conn)
	if cfg.URL == "" {
		srv, err := Start(cfg.Embedded())
		if err != nil {
			return nil, nil, err
		}
		l.Server, l.URL = srv, srv.ClientURL()
		if cfg.Started != nil {
			cfg.Started(srv)
		}
	} else {
		onConnect = append(onConnect, CheckMaxPayload(cfg.Logger))
	}
	nc, err := l.Dial(name, onConnect...)
	if err != nil {
		if l.Server != nil {
			l.Server.Shutdown()
		}
		return nil, nil, err
	}
	return l, nc, nil
}

// Dial opens another of the service's connections, named name, to the
// linked server with its credentials and TLS: the embedded server's
// internal user, or the external options.
func (l *Link) Dial(name string, onConnect ...func(*nats.Conn)) (*nats.Conn, error) {
	var opts []nats.Option
	switch {
	case l.Server != nil:
		opts = l.Server.ClientOptions()
	case l.cfg.External != nil:
		opts = l.cfg.External()
	}
	return Dial(l.URL, name, l.cfg.Logger, opts, onConnect...)
}
