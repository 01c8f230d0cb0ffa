package security

import (
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/cmd/internal/fdlimit"
	"github.com/telemetryd/telemetryd/ingest/natsembed"
)

// State is the running state of the access rules: credentials
// (reloaded on change and SIGHUP), TLS, the cursor key and the
// file-descriptor budget.
type State struct {
	cfg   Config
	log   *slog.Logger
	Creds *auth.Store // nil without -auth-file
	TLS   *tls.Config // nil without -tls-cert
	// CursorKey seals pagination cursors (-cursor-key or the
	// installation's key).
	CursorKey []byte
	HTTPConns int // -http-max-conns, lowered to fit the descriptor limit
	NATSConns int // the embedded server's share of the descriptors

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Open raises the file-descriptor limit and splits it, loads TLS and
// the cursor key (kept in dataDir unless -cursor-key), and opens the
// auth file.
// Close stops its reload watchers.
func Open(cfg Config, dataDir string, log *slog.Logger) (*State, error) {
	s := &State{cfg: cfg, log: log.With("component", "auth")}
	fdLimit := fdlimit.Raise(log)
	s.HTTPConns, s.NATSConns = fdlimit.Split(fdLimit, cfg.HTTPMaxConns)
	if s.HTTPConns != cfg.HTTPMaxConns {
		log.Warn("-http-max-conns lowered to keep file descriptors for the store", "http_max_conns", s.HTTPConns,
			"fd_limit", fdLimit, "store_reserve", fdlimit.StoreReserve)
	}
	var err error
	if s.TLS, err = cfg.LoadTLS(); err != nil {
		return nil, err
	}
	if s.CursorKey, err = cfg.LoadCursorKey(dataDir); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if cfg.AuthFile == "" {
		return s, nil
	}
	if s.Creds, err = auth.Open(cfg.AuthFile, s.log); err != nil {
		cancel()
		return nil, err
	}
	s.wg.Go(func() { s.Creds.Watch(ctx, auth.DefaultPollInterval) })
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	s.wg.Go(func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				changed, err := s.Creds.Reload()
				if err != nil {
					s.log.Error("SIGHUP: auth file not reloaded; the previous credentials stay in force", "path", cfg.AuthFile, "err", err)
				} else {
					s.log.Info("SIGHUP: auth file reloaded", "path", cfg.AuthFile, "changed", changed)
				}
			}
		}
	})
	return s, nil
}

// Close stops the reload watchers.
func (s *State) Close() {
	s.cancel()
	s.wg.Wait()
}

// Tokens is the API's token checker, nil (open API) without -auth-file.
func (s *State) Tokens() api.Tokens {
	if s.Creds == nil {
		return nil
	}
	return s.Creds
}

// EmbeddedNATS adds to ncfg the embedded server's share of the access
// rules: its connection limit, TLS and device authentication.
func (s *State) EmbeddedNATS(ncfg natsembed.Config) natsembed.Config {
	ncfg.MaxConn, ncfg.TLS = s.NATSConns, s.TLS
	if s.Creds != nil {
		ncfg.Devices = func() natsembed.Devices { return s.Creds.Current() }
	}
	return ncfg
}

// WatchNATS disconnects devices removed from the auth file on reload.
func (s *State) WatchNATS(srv *natsembed.Server) {
	if s.Creds == nil {
		return
	}
	s.Creds.OnChange(func(set *auth.Set) { srv.DisconnectRemovedDevices(set.HasDevice) })
}

// NATSClientOptions are the credentials of the service's connections to
// an external server (-nats-url): -nats-creds or -nats-user.
func (s *State) NATSClientOptions() []nats.Option {
	switch {
	case s.cfg.NATSCreds != "":
		return []nats.Option{nats.UserCredentials(s.cfg.NATSCreds)}
	case s.cfg.NATSUser != "":
		return []nats.Option{nats.UserInfo(s.cfg.NATSUser, s.cfg.NATSPassword)}
	}
	return nil
}
