// Package security holds the service's access rules: the security
// flags (credentials, TLS, HTTP limits, the cursor key and the
// credentials of an external NATS server), their checks, and the
// running state built from them (SECURITY.md).
package security

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/telemetryd/telemetryd/cmd/internal/cursorkey"
)

// Config holds the security flags (SECURITY.md).
type Config struct {
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
	DefaultHTTPMaxConns          = 1024
	DefaultHTTPMaxConnsPerClient = 64
	DefaultHTTPRate              = 1000
	DefaultHTTPBurst             = 2000
)

// MinCursorKeyLen is the shortest -cursor-key accepted.
const MinCursorKeyLen = 32

// Default returns the security defaults: no credentials, no TLS, the
// default HTTP limits.
func Default() Config {
	return Config{
		HTTPMaxConns:          DefaultHTTPMaxConns,
		HTTPMaxConnsPerClient: DefaultHTTPMaxConnsPerClient,
		HTTPRate:              DefaultHTTPRate,
		HTTPBurst:             DefaultHTTPBurst,
	}
}

// Bind registers the security flags on fs, with c's values as defaults.
func (c *Config) Bind(fs *flag.FlagSet) {
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

// Listener is one network listener of the service and the flag that
// sets it.
type Listener struct{ Flag, Addr string }

// Validate checks the security flags together with -nats-url, and refuses listeners beyond loopback without credentials
// (SECURITY.md).
func (c Config) Validate(natsURL string, listeners []Listener) error {
	var errs []error
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("-tls-cert and -tls-key go together"))
	}
	if c.HTTPMaxConns < 0 || c.HTTPMaxConnsPerClient < 0 || c.HTTPRate < 0 || c.HTTPBurst < 0 {
		errs = append(errs, errors.New("-http-max-conns, -http-max-conns-per-client, -http-rate and -http-burst must not be negative"))
	}
	if c.CursorKey != "" && len(c.CursorKey) < MinCursorKeyLen {
		errs = append(errs, fmt.Errorf("-cursor-key has %d characters; use at least %d random ones", len(c.CursorKey), MinCursorKeyLen))
	}
	if c.NATSCreds != "" && c.NATSUser != "" {
		errs = append(errs, errors.New("-nats-creds and -nats-user exclude each other"))
	}
	if (c.NATSUser == "") != (c.NATSPassword == "") {
		errs = append(errs, errors.New("-nats-user and -nats-password go together"))
	}
	if (c.NATSCreds != "" || c.NATSUser != "") && natsURL == "" {
		errs = append(errs, errors.New("-nats-creds, -nats-user and -nats-password need -nats-url (the embedded server uses an internal credential)"))
	}
	if c.AuthFile == "" && !c.Insecure {
		for _, l := range listeners {
			if l.Addr != "" && !IsLoopbackAddr(l.Addr) {
				errs = append(errs, fmt.Errorf("%s %q listens beyond loopback without credentials: add -auth-file FILE (create it with telemetryd auth add-token / add-device), or -insecure to expose it unauthenticated", l.Flag, l.Addr))
			}
		}
	}
	return errors.Join(errs...)
}

// IsLoopbackAddr reports whether a listen address ("host:port") binds
// only loopback. An empty host binds every interface.
func IsLoopbackAddr(addr string) bool {
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

// LoadTLS loads -tls-cert/-tls-key, or returns nil without them.
func (c Config) LoadTLS() (*tls.Config, error) {
	if c.TLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("-tls-cert %s / -tls-key %s: %w", c.TLSCert, c.TLSKey, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// LoadCursorKey returns -cursor-key, or the installation's key in
// dataDir (package cursorkey).
func (c Config) LoadCursorKey(dataDir string) ([]byte, error) {
	if c.CursorKey != "" {
		return []byte(c.CursorKey), nil
	}
	return cursorkey.Load(dataDir)
}
