package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/ingest"
)

// security is the running state of the access rules (SECURITY.md): credentials (reloaded
// on change and SIGHUP), TLS, the cursor key, the internal NATS
// credential and the file-descriptor budget.
type security struct {
	cfg       Config
	base      *slog.Logger
	log       *slog.Logger
	creds     *auth.Store // nil without -auth-file
	tls       *tls.Config // nil without -tls-cert
	cursorKey []byte
	internal  string // password of the service's own NATS connection
	denied    *deniedReporter
	httpConns int
	natsConns int

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// deniedLogInterval is the sampling interval of denial log lines.
const deniedLogInterval = 10 * time.Second

func openSecurity(cfg Config, log *slog.Logger, meter metric.MeterProvider) (*security, error) {
	s := &security{cfg: cfg, base: log, log: log.With("component", "auth")}
	fdLimit := raiseFDLimit(log)
	s.httpConns, s.natsConns = connBudget(fdLimit, cfg.Security.HTTPMaxConns)
	if s.httpConns != cfg.Security.HTTPMaxConns {
		log.Warn("-http-max-conns lowered to keep file descriptors for the store", "http_max_conns", s.httpConns,
			"fd_limit", fdLimit, "store_reserve", storeFDReserve)
	}
	var err error
	if s.denied, err = newDeniedReporter(meter.Meter("github.com/telemetryd/telemetryd/cmd/telemetryd"), s.log, deniedLogInterval); err != nil {
		return nil, err
	}
	if s.tls, err = cfg.Security.loadTLS(); err != nil {
		return nil, err
	}
	if s.cursorKey, err = cfg.Security.cursorKey(cfg.DataDir); err != nil {
		return nil, err
	}
	if s.internal, err = auth.NewSecret(); err != nil {
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
					s.log.Info("SIGHUP: reloading the auth file", "path", cfg.Security.AuthFile)
					_, _ = s.creds.Reload() // logged inside
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

// configureNATS sets the embedded server's authentication, TLS and
// connection limit.
func (s *security) configureNATS(o *server.Options) *natsLogger {
	o.MaxConn = s.natsConns
	if s.tls != nil {
		o.TLSConfig = s.tls.Clone()
		o.TLS = true
		o.TLSTimeout = 5
		o.MQTT.TLSConfig = s.tls.Clone()
		o.MQTT.TLSTimeout = 5
	}
	if s.creds != nil {
		o.CustomClientAuthentication = &deviceAuth{creds: s.creds, prefix: s.cfg.SubjectPrefix, internal: s.internal, denied: s.denied}
	}
	return &natsLogger{l: s.base.With("component", "nats"), denied: s.denied,
		sampler: &ingest.LogSampler{Burst: 20, Interval: deniedLogInterval}}
}

// watchNATS disconnects devices removed from the auth file on reload.
func (s *security) watchNATS(ns *server.Server) {
	if s.creds == nil {
		return
	}
	s.creds.OnChange(func(set *auth.Set) { kickRemovedDevices(ns, set, s.log) })
}

// natsClientOptions are the service connection's credentials and TLS:
// the internal user (embedded) or -nats-creds / -nats-user (external).
func (s *security) natsClientOptions(embedded bool) []nats.Option {
	var opts []nats.Option
	if !embedded {
		switch {
		case s.cfg.Security.NATSCreds != "":
			opts = append(opts, nats.UserCredentials(s.cfg.Security.NATSCreds))
		case s.cfg.Security.NATSUser != "":
			opts = append(opts, nats.UserInfo(s.cfg.Security.NATSUser, s.cfg.Security.NATSPassword))
		}
		return opts
	}
	// Devices share the embedded server: the service's replies and
	// pulled messages go to an inbox prefix they may not subscribe to.
	opts = append(opts, nats.CustomInboxPrefix(serviceInboxPrefix))
	if s.creds != nil {
		opts = append(opts, nats.UserInfo(internalUser, s.internal))
	}
	if s.tls != nil {
		opts = append(opts, nats.Secure(pinnedTLS(s.tls)))
	}
	return opts
}

// pinnedTLS trusts exactly the certificate the embedded server serves:
// the service's own connection needs no CA and no host name.
func pinnedTLS(c *tls.Config) *tls.Config {
	leaf := c.Certificates[0].Certificate[0]
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by the pin below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], leaf) {
				return errors.New("embedded nats presented another certificate than -tls-cert")
			}
			return nil
		},
	}
}
