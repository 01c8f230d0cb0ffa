package main

import (
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/cmd/internal/fdlimit"
	"github.com/telemetryd/telemetryd/ingest/natsembed"
)

// security is the running state of the access rules (SECURITY.md): credentials (reloaded
// on change and SIGHUP), TLS, the cursor key and the file-descriptor
// budget.
type security struct {
	cfg       Config
	log       *slog.Logger
	creds     *auth.Store // nil without -auth-file
	tls       *tls.Config // nil without -tls-cert
	cursorKey []byte
	httpConns int
	natsConns int

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func openSecurity(cfg Config, log *slog.Logger) (*security, error) {
	s := &security{cfg: cfg, log: log.With("component", "auth")}
	fdLimit := fdlimit.Raise(log)
	s.httpConns, s.natsConns = fdlimit.Split(fdLimit, cfg.Security.HTTPMaxConns)
	if s.httpConns != cfg.Security.HTTPMaxConns {
		log.Warn("-http-max-conns lowered to keep file descriptors for the store", "http_max_conns", s.httpConns,
			"fd_limit", fdLimit, "store_reserve", fdlimit.StoreReserve)
	}
	var err error
	if s.tls, err = cfg.Security.loadTLS(); err != nil {
		return nil, err
	}
	if s.cursorKey, err = cfg.Security.cursorKey(cfg.DataDir); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if cfg.Security.AuthFile != "" {
		var extra []auth.Token
		if cfg.AdminToken != "" {
			extra = append(extra, auth.Token{Name: "admin-token", Secret: auth.HashSecret(cfg.AdminToken), Scopes: []auth.Scope{auth.ScopeAdmin}})
		}
		if s.creds, err = auth.Open(cfg.Security.AuthFile, s.log, extra...); err != nil {
			cancel()
			return nil, err
		}
		s.wg.Go(func() { s.creds.Watch(ctx, auth.DefaultPollInterval) })
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		s.wg.Go(func() {
			defer signal.Stop(hup)
			for {
				select {
				case <-ctx.Done():
					return
				case <-hup:
					changed, err := s.creds.Reload()
					if err != nil {
						s.log.Error("SIGHUP: auth file not reloaded; the previous credentials stay in force", "path", cfg.Security.AuthFile, "err", err)
					} else {
						s.log.Info("SIGHUP: auth file reloaded", "path", cfg.Security.AuthFile, "changed", changed)
					}
				}
			}
		})
	}
	return s, nil
}

// Close stops the reload watchers.
func (s *security) Close() {
	s.cancel()
	s.wg.Wait()
}

// tokens is the API's token checker, nil (open API) without -auth-file.
func (s *security) tokens() api.Tokens {
	if s.creds == nil {
		return nil
	}
	return s.creds
}

// apiAdminToken is the API's own admin token: -admin-token without an
// auth file (with one it is a token of the auth set instead).
func (s *security) apiAdminToken(t string) string {
	if s.creds != nil {
		return ""
	}
	return t
}

// embeddedNATS is the embedded server's configuration: listeners,
// TLS, connection limit and device authentication.
func (s *security) embeddedNATS(cfg Config, jsMemory int64, log *slog.Logger, meter metric.MeterProvider) natsembed.Config {
	ncfg := natsembed.Config{
		Listen:             cfg.NATSListen,
		MQTTListen:         cfg.MQTTListen,
		StoreDir:           filepath.Join(cfg.DataDir, "nats"),
		SyncAlways:         cfg.SyncWrites,
		MaxConn:            s.natsConns,
		JetStreamMaxMemory: jsMemory,
		TLS:                s.tls,
		SubjectPrefix:      cfg.SubjectPrefix,
		MQTTStreamMaxBytes: cfg.MQTTStreamMaxBytes,
		Logger:             log,
		MeterProvider:      meter,
	}
	if s.creds != nil {
		ncfg.Devices = func() natsembed.Devices { return s.creds.Current() }
	}
	return ncfg
}

// watchNATS disconnects devices removed from the auth file on reload.
func (s *security) watchNATS(srv *natsembed.Server) {
	if s.creds == nil {
		return
	}
	s.creds.OnChange(func(set *auth.Set) { srv.DisconnectRemovedDevices(set.HasDevice) })
}

// natsClientOptions are the credentials of the service's connections to
// an external server (-nats-url): -nats-creds or -nats-user.
func (s *security) natsClientOptions() []nats.Option {
	switch {
	case s.cfg.Security.NATSCreds != "":
		return []nats.Option{nats.UserCredentials(s.cfg.Security.NATSCreds)}
	case s.cfg.Security.NATSUser != "":
		return []nats.Option{nats.UserInfo(s.cfg.Security.NATSUser, s.cfg.Security.NATSPassword)}
	}
	return nil
}
