// Package api is the HTTP query and admin API of the telemetry service
// (api/README.md): log-tail, time-range and point queries over readings,
// the device index, day tables, and the admin operations that drop
// tables and run retention. It is an Echo server with one error
// mapping, opaque integrity-checked cursors, a hand-written JSON
// encoder for readings, and OpenTelemetry traces and metrics.
//
// The package declares the small interfaces it needs (Reader, Admin,
// Attributes);
// the service binary wires the store into them.
package api

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/api/limit"
	"github.com/telemetryd/telemetryd/api/promapi"
	"github.com/telemetryd/telemetryd/buckets"
)

// Reader is what the API needs to answer queries (implemented by the
// store).
type Reader interface {
	// Latest returns the newest n readings of dev, newest first.
	Latest(ctx context.Context, dev buckets.DeviceID, n int) ([]buckets.Reading, error)
	// Range returns one page of a range query; q.After resumes strictly
	// behind a position.
	Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error)
	// Get returns the reading of dev at exactly k; the error wraps
	// buckets.ErrNotFound when there is none.
	Get(ctx context.Context, dev buckets.DeviceID, k buckets.Ticks) (buckets.Reading, error)
	// Devices lists at most q.Limit devices that q selects, sorted by
	// ID, each with its attributes; more is true when more remain.
	Devices(ctx context.Context, q buckets.DeviceQuery) (devs []buckets.DeviceInfo, more bool, err error)
	// Tables lists the day tables.
	Tables(ctx context.Context) ([]buckets.TableInfo, error)
}

// Attributes reads one device's record and changes device attributes
// (implemented by the store and the cluster router).
type Attributes interface {
	// Device returns dev's record with its attributes; the error wraps
	// buckets.ErrNotFound when the device is not known.
	Device(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceInfo, error)
	// Assign applies attribute assignments: the newest by At wins per
	// attribute. Invalid ones are refused with *buckets.ValidationError.
	Assign(ctx context.Context, as []buckets.Assignment) error
}

// Admin runs the admin operations. A nil Admin makes those endpoints
// answer 501 not_implemented.
type Admin interface {
	// DropTable drops the table of day now; the error wraps
	// buckets.ErrNotFound when there is no such table.
	DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error)
	// RunRetention drops expired tables, or only reports them when
	// dryRun is set.
	RunRetention(ctx context.Context, dryRun bool) (buckets.RetentionReport, error)
	// DeleteDevice deletes a device's readings, latest values, record
	// and attributes (on every node of a cluster); the error wraps
	// buckets.ErrNotFound when the device is not known.
	DeleteDevice(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error)
}

// Defaults applied by New to zero Config fields (MaxFutureSkew takes
// buckets.DefaultMaxFutureSkew).
const (
	// DefaultAddr is loopback only: serving other hosts is a decision
	// (SECURITY.md).
	DefaultAddr         = "127.0.0.1:8080"
	DefaultMaxInFlight  = 256
	DefaultQueryTimeout = 10 * time.Second
	DefaultClientShares = 4
	// MaxBodyBytes is the largest request body accepted (413 beyond).
	MaxBodyBytes = 1 << 20
)

// Config configures a Server. Only Reader is required.
type Config struct {
	// Addr is the listen address, e.g. "127.0.0.1:8080" ("127.0.0.1:0"
	// in tests). Default DefaultAddr.
	Addr string
	// Reader answers queries.
	Reader Reader
	// Admin runs admin operations; nil makes them answer 501.
	Admin Admin
	// Backups serves POST /v1/backup; nil makes it answer 501.
	Backups Backups
	// BackupRoot is the directory every backup of POST /v1/backup must
	// lie under (checked through symbolic links); required with Backups.
	BackupRoot string
	// Aggregator answers GET /v1/devices/{device}/aggregates; nil makes
	// it answer 501.
	Aggregator Aggregator
	// Attributes answers GET /v1/devices/{device} and the attribute
	// writes (PUT and PATCH /v1/devices/{device}/attributes); nil makes
	// them answer 501.
	Attributes Attributes
	// Retention is how long readings are kept. A device whose last
	// reading is older is gone rather than silent: GET
	// /v1/devices?silent_for= leaves it out, and silent_for may not
	// exceed it. 0: no bound.
	Retention time.Duration
	// PromQL serves the Prometheus query API under /api/v1/ (package
	// promapi); nil leaves those paths unrouted.
	PromQL http.Handler
	// Alerts serves the rules and alerts API and the reload of the rule
	// files; nil: no rules.
	Alerts *AlertsConfig
	// AlertSeries are the alert series (ALERTS, ALERTS_FOR_STATE) that
	// WithDashboards adds to the PromQL API.
	AlertSeries promapi.Extra
	// Ready reports readiness: nil error => /readyz 200, else 503 with
	// the error text as the reason. A nil func is always ready.
	Ready func(ctx context.Context) error
	// Durability is the durability mode (ingest.DurabilitySynced, ...)
	// and what an ack promises in it, reported by a ready /readyz.
	// Empty: not reported.
	Durability, DurabilityAck string
	// Streams names the readings streams the service consumes (one per
	// partition), reported by a ready /readyz. Empty: not reported.
	Streams []string
	// Metrics is served at GET /metrics (Prometheus exposition); nil
	// makes it answer 404.
	Metrics http.Handler
	// Build is what GET /api/v1/status/buildinfo reports (the version
	// and commit of -version); an empty Version reports the module
	// version and VCS stamp Go recorded.
	Build promapi.BuildInfo
	// MaxFutureSkew sets the default `to` of a range query (now +
	// skew). Default buckets.DefaultMaxFutureSkew.
	MaxFutureSkew time.Duration
	// ExpiresAt returns when the retention policy drops each table
	// (same order), reported as expiresAt by GET /v1/tables; the
	// service passes retention.Policy.ExpiresAt. Nil leaves expiresAt
	// out.
	ExpiresAt func(tables []buckets.TableInfo, now time.Time) []time.Time
	// MaxInFlight bounds concurrent query requests; beyond it a query
	// gets 429 with Retry-After. Default DefaultMaxInFlight.
	MaxInFlight int
	// QueryTimeout is the deadline of one query request. Default
	// DefaultQueryTimeout.
	QueryTimeout time.Duration
	// CursorKey is the HMAC-SHA256 key that signs pagination cursors.
	// It must stay the same across restarts (and across replicas) for
	// cursors to keep working; the service keeps one per installation.
	// If empty, a random key is made for this Server only.
	// Cursors are never secret: they only hold query parameters.
	CursorKey []byte
	// Auth, when set, makes every route but /healthz, /readyz and
	// /openapi.json need a token with the route's scope (SECURITY.md;
	// see authn.go). Nil leaves the API open.
	Auth Tokens
	// RateLimit is the requests per second allowed per token (or per
	// client address without one), with bursts of RateBurst; past it a
	// request gets 429 with Retry-After. It also bounds the new
	// connections per second of one address. 0 means no limit.
	RateLimit float64
	RateBurst int
	// MaxConns bounds the open connections, MaxConnsPerClient those of
	// one client address; a connection past either is refused at once.
	// 0 means no limit.
	MaxConns          int
	MaxConnsPerClient int
	// TLSConfig, when set, makes the server speak HTTPS only.
	TLSConfig *tls.Config
	// ResponseBudget bounds the bytes of query responses in flight
	// (stream.go); past it a query is answered 503 with Retry-After.
	// Default DefaultResponseBudget.
	ResponseBudget int64
	// ClientShares divides ResponseBudget and MaxInFlight among
	// clients: one client (a token, or a client address without one)
	// holds at most 1/ClientShares of either at once; past its share it
	// gets 429 with Retry-After while other clients are still served.
	// 1 lets one client take all. Default DefaultClientShares.
	ClientShares int
	// StallTimeout cuts off a client that does not take a chunk of a
	// streamed response within it. Default DefaultStallTimeout.
	StallTimeout time.Duration
	// Writes configures the line protocol write endpoints; nil (or a
	// nil Publisher) makes them answer 501.
	Writes *WriteConfig
	// Internal, when set, serves the node-to-node API of a cluster under
	// /internal/ (package api/cluster): only to calls with the cluster
	// credential, with their client's rights, outside the rate limit.
	// Nil leaves those paths unrouted.
	Internal InternalAPI
	// Cluster, when set, answers GET /v1/cluster; nil answers 404.
	Cluster ClusterView

	// Logger, TracerProvider, MeterProvider and Now default to
	// slog.Default, the otel global providers and time.Now. Now decides
	// the default window of range queries.
	Logger         *slog.Logger
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Now            func() time.Time
}

// Server is the HTTP API. Create it with New, start it with Open and
// stop it with Close, or mount Handler in a test server.
type Server struct {
	reader       Reader
	admin        Admin
	backups      Backups
	backupRoot   string
	aggregator   Aggregator
	attributes   Attributes
	retention    time.Duration
	promql       http.Handler
	alerts       *AlertsConfig
	internal     InternalAPI
	cluster      ClusterView
	ready        func(ctx context.Context) error
	durability   Status // the durability fields of a ready answer
	metrics      http.Handler
	skew         time.Duration
	expiresAt    func(tables []buckets.TableInfo, now time.Time) []time.Time
	queryTimeout time.Duration
	addrCfg      string
	log          *slog.Logger
	now          func() time.Time
	cursors      cursorCodec
	tokens       Tokens
	rates        *limit.Rates
	maxConns     int
	maxPerClient int
	tlsConfig    *tls.Config
	conns        *limit.Listener
	inFlight     chan struct{}
	maxInFlight  int
	echo         *echo.Echo
	routes       map[string]string // echo path -> route template
	obs          observer
	writes       *writer
	budget       *byteBudget
	shares       *quota // each client's share of budget; nil: not divided
	perClient    *quota // each client's share of MaxInFlight; nil: not divided
	stallTimeout time.Duration
	respM        responseMetrics
	mu           sync.Mutex // guards httpSrv, listener, done, closed
	httpSrv      *http.Server
	listener     net.Listener
	done         chan struct{}
	closed       bool
	closeOnce    sync.Once
	closeErr     error
}

// New validates cfg, applies defaults and builds the routes. It does
// not listen; call Open for that.
func New(cfg Config) (*Server, error) {
	if cfg.Reader == nil {
		return nil, errors.New("api: Config.Reader is required")
	}
	if cfg.MaxInFlight < 0 || cfg.MaxFutureSkew < 0 || cfg.QueryTimeout < 0 ||
		cfg.RateLimit < 0 || cfg.RateBurst < 0 || cfg.MaxConns < 0 || cfg.MaxConnsPerClient < 0 ||
		cfg.ResponseBudget < 0 || cfg.StallTimeout < 0 || cfg.ClientShares < 0 || cfg.Retention < 0 {
		return nil, errors.New("api: MaxInFlight, MaxFutureSkew, QueryTimeout, RateLimit, RateBurst, MaxConns, MaxConnsPerClient, ResponseBudget, StallTimeout, ClientShares and Retention must not be negative")
	}
	if cfg.Backups != nil && cfg.BackupRoot == "" {
		return nil, errors.New("api: Backups needs a BackupRoot")
	}
	s := &Server{
		reader:       cfg.Reader,
		admin:        cfg.Admin,
		backups:      cfg.Backups,
		backupRoot:   cfg.BackupRoot,
		aggregator:   cfg.Aggregator,
		attributes:   cfg.Attributes,
		retention:    cfg.Retention,
		promql:       cfg.PromQL,
		alerts:       cfg.Alerts,
		internal:     cfg.Internal,
		cluster:      cfg.Cluster,
		ready:        cfg.Ready,
		durability:   Status{Durability: cfg.Durability, Ack: cfg.DurabilityAck, Streams: cfg.Streams},
		metrics:      cfg.Metrics,
		skew:         cmp.Or(cfg.MaxFutureSkew, buckets.DefaultMaxFutureSkew),
		expiresAt:    cfg.ExpiresAt,
		queryTimeout: cmp.Or(cfg.QueryTimeout, DefaultQueryTimeout),
		addrCfg:      cfg.Addr,
		log:          cfg.Logger,
		now:          cfg.Now,
		cursors:      newCursorCodec(cfg.CursorKey),
		maxInFlight:  cmp.Or(cfg.MaxInFlight, DefaultMaxInFlight),
		tokens:       cfg.Auth,
		rates:        limit.NewRates(cfg.RateLimit, cfg.RateBurst),
		maxConns:     cfg.MaxConns,
		maxPerClient: cfg.MaxConnsPerClient,
		tlsConfig:    cfg.TLSConfig,
		budget:       newByteBudget(cmp.Or(cfg.ResponseBudget, DefaultResponseBudget)),
		stallTimeout: cmp.Or(cfg.StallTimeout, DefaultStallTimeout),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.inFlight = make(chan struct{}, s.maxInFlight)
	if div := cmp.Or(cfg.ClientShares, DefaultClientShares); div > 1 {
		s.perClient = newQuota(int64(s.maxInFlight / div))
		s.shares = newQuota(s.budget.size / int64(div))
	}
	s.writes = newWriter(cfg.Writes, s.now)
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	obs, err := newObserver(tp, mp)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	s.obs = obs
	if s.respM, err = newResponseMetrics(mp); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	s.writes.refused = s.respM.writesRefused
	s.echo = echo.New()
	s.echo.HideBanner = true
	s.echo.HidePort = true
	s.echo.HTTPErrorHandler = s.handleError
	s.registerRoutes()
	return s, nil
}

// Handler returns the HTTP handler of the API, for httptest or for
// mounting under another server.
func (s *Server) Handler() http.Handler { return s.echo }

// Open listens on Config.Addr (so Addr works right after it returns)
// and serves in a goroutine that Close stops and waits for.
func (s *Server) Open() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.httpSrv != nil || s.closed {
		return errors.New("api: server already opened or closed")
	}
	addr := cmp.Or(s.addrCfg, DefaultAddr)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("api: listen %s: %w", addr, err)
	}
	s.listener = ln
	s.conns = limit.NewListener(ln, s.maxConns, s.maxPerClient, s.connRates(), s.tlsConfig == nil)
	ln = s.conns
	if s.tlsConfig != nil {
		ln = tls.NewListener(ln, s.tlsConfig)
	}
	s.httpSrv = &http.Server{
		Handler:           s.echo,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.done = make(chan struct{})
	go s.serve(s.httpSrv, ln, s.done)
	s.log.Debug("http api listening", "addr", ln.Addr().String()) // the service's start-up line names every listener
	return nil
}

func (s *Server) serve(srv *http.Server, ln net.Listener, done chan struct{}) {
	defer close(done)
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.log.Error("http api stopped serving", "err", err)
	}
}

// Addr returns the actual listen address, e.g. "127.0.0.1:41234", or
// "" before Open.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener == nil {
		return ""
	}
	return s.listener.Addr().String()
}

// Close shuts the server down gracefully: it stops accepting
// connections, waits for in-flight requests until ctx ends (then closes
// the remaining connections) and waits for the serve goroutine. It is
// safe to call more than once and without Open.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		srv, done := s.httpSrv, s.done
		s.mu.Unlock()
		if srv == nil {
			return
		}
		if err := srv.Shutdown(ctx); err != nil {
			s.closeErr = errors.Join(fmt.Errorf("api: shutdown: %w", err), srv.Close())
		}
		<-done
	})
	return s.closeErr
}
