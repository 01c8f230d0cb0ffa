package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/cmd/internal/cursorkey"
)

// SecurityConfig holds the security flags (SECURITY.md).
type SecurityConfig struct {
	AuthFile string // -auth-file: device and token credentials
	Insecure bool   // -insecure: allow non-loopback listeners without credentials
	TLSCert  string // -tls-cert: PEM certificate (chain) for HTTPS, NATS and MQTT
	TLSKey   string // -tls-key: its PEM private key

	HTTPMaxConns          int     // -http-max-conns
	HTTPMaxConnsPerClient int     // -http-max-conns-per-client
	HTTPRate              float64 // -http-rate: requests/s per token or address
	HTTPBurst             int     // -http-burst

	CursorKey string // -cursor-key; empty: <data-dir>/cursor.key

	NATSCreds    string // -nats-creds (with -nats-url)
	NATSUser     string // -nats-user (with -nats-url)
	NATSPassword string // -nats-password (with -nats-url)
}

// Security defaults.
const (
	defaultHTTPMaxConns          = 1024
	defaultHTTPMaxConnsPerClient = 64
	defaultHTTPRate              = 1000
	defaultHTTPBurst             = 2000
)

func defaultSecurity() SecurityConfig {
	return SecurityConfig{
		HTTPMaxConns:          defaultHTTPMaxConns,
		HTTPMaxConnsPerClient: defaultHTTPMaxConnsPerClient,
		HTTPRate:              defaultHTTPRate,
		HTTPBurst:             defaultHTTPBurst,
	}
}

func (c *SecurityConfig) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.AuthFile, "auth-file", c.AuthFile, "JSON file of device secrets and API tokens (see telemetryd auth); reloaded on change and SIGHUP. Without it every listener must be on loopback")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "allow listeners beyond loopback without -auth-file: anyone who reaches them can read, write and publish as any device")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM certificate for HTTPS and the embedded NATS and MQTT listeners (with -tls-key)")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM private key of -tls-cert")
	fs.IntVar(&c.HTTPMaxConns, "http-max-conns", c.HTTPMaxConns, "most open HTTP connections; more are refused at once (0 = no limit)")
	fs.IntVar(&c.HTTPMaxConnsPerClient, "http-max-conns-per-client", c.HTTPMaxConnsPerClient, "most open HTTP connections from one address (0 = no limit)")
	fs.Float64Var(&c.HTTPRate, "http-rate", c.HTTPRate, "HTTP requests (and new connections) per second per token, or per address without one; past it 429 with Retry-After (0 = no limit)")
	fs.IntVar(&c.HTTPBurst, "http-burst", c.HTTPBurst, "burst allowed above -http-rate")
	fs.StringVar(&c.CursorKey, "cursor-key", c.CursorKey, "secret that seals pagination cursors (at least 32 characters); empty: a random key kept in <data-dir>/"+cursorkey.File)
	fs.StringVar(&c.NATSCreds, "nats-creds", c.NATSCreds, "credentials file (JWT and NKey) for -nats-url")
	fs.StringVar(&c.NATSUser, "nats-user", c.NATSUser, "user name for -nats-url")
	fs.StringVar(&c.NATSPassword, "nats-password", c.NATSPassword, "password for -nats-url (prefer TELEMETRY_NATS_PASSWORD)")
}

// validateSecurity checks the security flags and refuses listeners
// beyond loopback without credentials (SECURITY.md).
func (c *Config) validateSecurity() error {
	s := &c.Security
	var errs []error
	if (s.TLSCert == "") != (s.TLSKey == "") {
		errs = append(errs, errors.New("-tls-cert and -tls-key go together"))
	}
	if s.HTTPMaxConns < 0 || s.HTTPMaxConnsPerClient < 0 || s.HTTPRate < 0 || s.HTTPBurst < 0 {
		errs = append(errs, errors.New("-http-max-conns, -http-max-conns-per-client, -http-rate and -http-burst must not be negative"))
	}
	if s.CursorKey != "" && len(s.CursorKey) < 32 {
		errs = append(errs, fmt.Errorf("-cursor-key has %d characters; use at least 32 random ones", len(s.CursorKey)))
	}
	if c.AdminToken != "" && len(c.AdminToken) < auth.MinSecretLen {
		errs = append(errs, fmt.Errorf("-admin-token has %d characters; use at least %d random ones (telemetryd auth add-token makes one)", len(c.AdminToken), auth.MinSecretLen))
	}
	if s.NATSCreds != "" && s.NATSUser != "" {
		errs = append(errs, errors.New("-nats-creds and -nats-user exclude each other"))
	}
	if (s.NATSUser == "") != (s.NATSPassword == "") {
		errs = append(errs, errors.New("-nats-user and -nats-password go together"))
	}
	if (s.NATSCreds != "" || s.NATSUser != "") && c.NATSURL == "" {
		errs = append(errs, errors.New("-nats-creds, -nats-user and -nats-password need -nats-url (the embedded server uses an internal credential)"))
	}
	if s.AuthFile == "" && !s.Insecure {
		for _, l := range c.listeners() {
			if l.addr != "" && !isLoopbackAddr(l.addr) {
				errs = append(errs, fmt.Errorf("%s %q listens beyond loopback without credentials: add -auth-file FILE (create it with telemetryd auth add-token / add-device), or -insecure to expose it unauthenticated", l.flag, l.addr))
			}
		}
	}
	return errors.Join(errs...)
}

// listener is one network listener and the flag that sets it.
type listener struct{ flag, addr string }

// listeners are the addresses the service would listen on.
func (c *Config) listeners() []listener {
	ls := []listener{{"-http-addr", c.HTTPAddr}, {"-pprof-addr", c.PprofAddr}}
	if c.NATSURL == "" {
		ls = append(ls, listener{"-nats-listen", c.NATSListen}, listener{"-mqtt-listen", c.MQTTListen})
	}
	return ls
}

// isLoopbackAddr reports whether a listen address ("host:port") binds
// only loopback. An empty host binds every interface.
func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// loadTLS loads -tls-cert/-tls-key, or returns nil without them.
func (s SecurityConfig) loadTLS() (*tls.Config, error) {
	if s.TLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(s.TLSCert, s.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("-tls-cert %s / -tls-key %s: %w", s.TLSCert, s.TLSKey, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// cursorKey returns -cursor-key, or the installation's key in dataDir
// (package cursorkey).
func (s SecurityConfig) cursorKey(dataDir string) ([]byte, error) {
	if s.CursorKey != "" {
		return []byte(s.CursorKey), nil
	}
	return cursorkey.Load(dataDir)
}
