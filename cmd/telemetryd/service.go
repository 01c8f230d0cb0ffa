package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/promapi"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/cmd/internal/alerting"
	"github.com/telemetryd/telemetryd/cmd/internal/cliflag"
	"github.com/telemetryd/telemetryd/cmd/internal/membudget"
	"github.com/telemetryd/telemetryd/cmd/internal/otelsetup"
	"github.com/telemetryd/telemetryd/cmd/internal/pprofserve"
	"github.com/telemetryd/telemetryd/cmd/internal/preflight"
	"github.com/telemetryd/telemetryd/cmd/internal/security"
	"github.com/telemetryd/telemetryd/cmd/internal/testhook"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/groupcommit"
	"github.com/telemetryd/telemetryd/ingest/intake"
	"github.com/telemetryd/telemetryd/ingest/natsembed"
	"github.com/telemetryd/telemetryd/ingest/topology"
	"github.com/telemetryd/telemetryd/retention"
	"github.com/telemetryd/telemetryd/store"
	"github.com/telemetryd/telemetryd/store/rollup"
)

// Main is one running service: it wires the concrete store, ingester,
// API and retention worker together and owns their lifecycles.
type Main struct {
	cfg    Config
	log    *slog.Logger
	getenv func(string) string

	// Test hooks; zero values mean production behaviour.
	now     func() time.Time
	telOpts otelsetup.Options

	tel      *otelsetup.Providers
	nats     *natsembed.Server // the embedded server; nil with -nats-url
	nc       *nats.Conn
	store    *store.Store
	ingest   []*ingest.Ingester // one per partition stream, or one for the single stream
	api      *api.Server
	ret      *retention.Worker
	pprof    *pprofserve.Server
	sec      *security.State
	budget   membudget.Budget
	stopPace func() // ends the GC pacer (membudget.Budget.Start)

	// writesNC publishes the line protocol door's messages; its acks do not queue behind nc's deliveries.
	writesNC *nats.Conn
	link     *natsembed.Link // how nc and writesNC reach the server
	// cluster is this node's share of a cluster (-partitions > 0); nil for a single node.
	cluster *clusterNode
	alerts  *alerting.Alerting // nil without -rules

	cancelIngest    context.CancelFunc
	cancelRetention context.CancelFunc
	ingestDone      chan struct{}
	intake          *intake.Intake // nil unless ingest.Config.Intake
	intakeNC        *nats.Conn
	wg              sync.WaitGroup
	closeOnce       sync.Once
	closeErr        error
	replaying       atomic.Bool // a repaired day awaits the stream's readings: a node's answers are partial
}

// minPullBytes is the least a consumer may pull at once.
const minPullBytes = membudget.MinPullBytes

// NewMain returns a service for cfg; Open starts it.
func NewMain(cfg Config, log *slog.Logger, getenv func(string) string) *Main {
	return &Main{cfg: cfg, log: log, getenv: getenv, now: time.Now, stopPace: func() {}}
}

// Open starts, in order: telemetry, store, NATS (embedded or external),
// ingester, retention worker and HTTP API. It returns once the API
// listens; on error the caller must still call Close.
func (m *Main) Open(ctx context.Context) error {
	// A test hook moves the clock (deploy/CLUSTER.md, "Under faults").
	now, offset, err := testhook.Clock(m.getenv)
	if err != nil {
		return err
	}
	if offset != 0 {
		m.now = now
		m.log.Warn("test hook: this process's clock is moved", "env", testhook.ClockOffsetEnv, "offset", offset.String())
	}
	// Every listener's port is tried before anything starts, so all
	// that are taken are named at once, each by its flag.
	if err := preflight.Listeners(m.cfg.listeners()); err != nil {
		return err
	}
	if err := preflight.DataDir(m.cfg.DataDir); err != nil {
		return err
	}
	tel, err := otelsetup.New(ctx, m.getenv, m.telOpts)
	if err != nil {
		return err
	}
	m.tel = tel
	tel.Install()

	if m.budget, err = membudget.Plan(m.cfg.MemoryLimit, m.cfg.HotDays, m.cfg.MaxOpenTables, m.cfg.MaxWriteBytes); err != nil {
		return err
	}
	if m.getenv("GOGC") != "" {
		m.budget.GCPercent = 0 // the operator's GOGC, which the runtime read at start, stays
	}
	m.stopPace = m.budget.Start(m.log)

	sopts := store.DefaultOptions()
	sopts.MemTableSize, sopts.BlockCacheSize = m.budget.MemTable, m.budget.BlockCache
	sopts.ColumnCacheSize = m.budget.ColumnCache
	if !m.cfg.ColumnCache {
		sopts.ColumnCacheSize = -1
	}
	sopts.IndexCacheSize = m.budget.IndexCache
	sopts.SyncWrites = m.cfg.SyncWrites
	sopts.SyncEvery = m.cfg.SyncInterval
	sopts.HotDays = m.cfg.HotDays
	sopts.MaxOpenTables = m.cfg.MaxOpenTables
	if sopts.Rollups, err = rollup.ParseLevels(m.cfg.Rollups); err != nil {
		return fmt.Errorf("-rollups: %w", err)
	}
	sopts.Logger = m.log // the store adds component=store itself
	sopts.TracerProvider, sopts.MeterProvider, sopts.Now = tel.Tracer, tel.Meter, m.now
	if sopts.FaultPoint, err = testhook.FaultPoint(m.getenv, m.log); err != nil {
		return err
	}
	// Library errors name their package and operation ("open store: ..."): returned as they are.
	if m.sec, err = security.Open(m.cfg.Security, m.cfg.DataDir, m.log); err != nil {
		return err
	}
	if err := m.fitSizes(); err != nil {
		return err
	}
	if m.store, err = store.Open(ctx, m.cfg.DataDir, sopts); err != nil {
		return err
	}
	if err := m.connectNATS(ctx); err != nil {
		return err
	}
	if m.cfg.Cluster.Partitions > 0 {
		if err := m.openCluster(ctx); err != nil {
			return err
		}
	} else if err := m.startIngest(); err != nil {
		return err
	} else if err := m.startIntake(); err != nil {
		return err
	}
	if err := m.startRetention(); err != nil {
		return err
	}
	if err := m.startHTTP(); err != nil {
		return err
	}
	if m.cluster != nil {
		m.runCluster()
	}
	m.logStarted()
	return nil
}

// logStarted writes the start-up lines that are the service's own, one
// per concern: who may connect (auth), then every listener. The memory
// budget and the store have theirs.
func (m *Main) logStarted() {
	tlsOn := m.cfg.Security.TLSCert != ""
	if m.cfg.Security.AuthFile != "" {
		m.log.Info("auth on: devices log in with their secret, HTTP clients need a token", "auth_file", m.cfg.Security.AuthFile, "tls", tlsOn)
	} else {
		m.log.Info("auth off: any client that reaches a listener may read, write and publish as any device (add -auth-file FILE)",
			"insecure", m.cfg.Security.Insecure, "tls", tlsOn)
	}
	natsURL := m.NATSURL()
	if m.nc != nil {
		natsURL = m.nc.ConnectedUrlRedacted()
	}
	args := []any{"http_addr", m.api.Addr(), "nats_url", natsURL, "embedded_nats", m.nats != nil}
	if mqtt := m.MQTTAddr(); mqtt != "" {
		args = append(args, "mqtt_addr", mqtt)
	} else {
		args = append(args, "mqtt_addr", "off")
	}
	if m.cfg.PprofAddr != "" {
		args = append(args, "pprof_addr", m.cfg.PprofAddr)
	}
	d := m.durability()
	args = append(args, "data_dir", m.cfg.DataDir, "subject", topology.For(m.cfg.SubjectPrefix).All(),
		"durability", d.Mode, "ack", d.Ack)
	m.log.Info("telemetryd started", args...)
}

// durability is the mode -sync-writes and the NATS server choose.
func (m *Main) durability() ingest.Durability {
	return ingest.DurabilityOf(m.cfg.SyncWrites, m.cfg.NATSURL == "", m.ingestConfig().Intake, m.cfg.SyncInterval)
}

// connectNATS starts the embedded server unless -nats-url is set, then
// connects with unlimited reconnects.
func (m *Main) connectNATS(ctx context.Context) error {
	link, nc, err := natsembed.OpenLink(natsembed.LinkConfig{URL: m.cfg.NATSURL, Embedded: m.embeddedNATS,
		Started: m.sec.WatchNATS, External: m.sec.NATSClientOptions, Logger: m.log}, "telemetryd")
	if err != nil {
		return err
	}
	m.link, m.nats, m.nc = link, link.Server, nc
	if m.nats != nil && m.store != nil {
		// A saved stream position waits for the streams' fsync too.
		m.store.SetPositionBarrier(m.nats.SyncStreams)
	}
	if m.nats == nil {
		if m.cfg.MQTTListen != "" {
			m.log.Info("mqtt listener not started: with -nats-url, MQTT is the NATS server's job")
		}
		return nil
	}
	return m.nats.StartMQTT(ctx, nc, m.ingestConfig())
}

// ingestConfig is the single node's ingest configuration, streams and
// subjects included.
func (m *Main) ingestConfig() ingest.Config {
	icfg := ingest.DefaultConfig()
	icfg.SubjectPrefix = m.cfg.SubjectPrefix
	icfg.Window = m.window()
	icfg.MQTTCopies = m.MQTTAddr() != "" // stored as <prefix>.<device> (natsembed)
	icfg.StreamMaxAge, icfg.StreamMaxBytes = m.cfg.StreamMaxAge, m.cfg.StreamMaxBytes
	icfg.RejectedMaxBytes = m.cfg.RejectedMaxBytes
	// With fsync before ack, a line protocol write's messages go as one atomic batch, fsynced once.
	icfg.AtomicPublish = m.cfg.SyncWrites
	if n := m.cfg.streamPartitions(); n > 0 {
		icfg.Partitions, icfg.PartitionStreams = n, true
		// With fsync before ack the service answers the devices'
		// publishes and stores them as atomic batches (package
		// ingest/intake): one fsync per batch, not per message.
		icfg.Intake = m.cfg.SyncWrites && m.cfg.Intake && m.cfg.NATSURL == ""
		icfg.AtomicPublish = icfg.AtomicPublish || icfg.Intake
		// The family shares -stream-max-bytes, in equal parts.
		icfg.StreamMaxBytes = max(icfg.StreamMaxBytes/int64(n), 1<<20)
	}
	return icfg
}

// startIngest runs an ingester per readings stream: one per partition
// (-stream-partitions), each with its own consumer, or one for the
// single stream.
func (m *Main) startIngest() error {
	icfg := m.ingestConfig()
	icfg.Positions, icfg.Tombstones = m.store, m.store
	icfg.PullMaxBytes = int(m.budget.PullBytes)
	// Intake pauses while the disk is short of its reserve or a day
	// table cannot commit: messages wait unacked in the stream.
	icfg.Hold = ingest.Holds(ingest.DiskReserve(m.cfg.DataDir, m.cfg.DiskReserve), m.commitBlocked)
	icfg.Logger = m.log.With("component", "ingest")
	icfg.TracerProvider, icfg.MeterProvider, icfg.Now = m.tel.Tracer, m.tel.Meter, m.now
	icfg.Restored = m.store.Restored() // resumeRestored clears it
	if err := m.resumeRestored(icfg); err != nil {
		return err
	}
	if err := m.checkMapping(icfg); err != nil {
		return err
	}
	if icfg.PartitionStreams {
		// Each partition pulls its share of the budget, with room for the largest message.
		icfg.PullMaxBytes = int(max(m.budget.PullBytes/int64(icfg.Partitions), minPullBytes))
	}
	cfgs := icfg.PerStream()
	w := groupcommit.New(m.store) // the ingesters share commits (and fsyncs)
	for _, c := range cfgs {
		if icfg.PartitionStreams {
			c.Logger = icfg.Logger.With("stream", c.Stream)
		}
		ing, err := ingest.New(m.nc, w, c)
		if err != nil {
			return err
		}
		m.ingest = append(m.ingest, ing)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancelIngest = cancel
	m.ingestDone = make(chan struct{})
	var wg sync.WaitGroup
	for i, ing := range m.ingest {
		wg.Go(func() {
			if err := ing.Run(ctx); err != nil {
				m.log.Error("ingest stopped", "stream", cfgs[i].Stream, "err", err)
			}
		})
	}
	if err := m.drainLeftovers(ctx, icfg, &wg); err != nil {
		cancel()
		wg.Wait()
		return err
	}
	go func() {
		wg.Wait()
		close(m.ingestDone)
	}()
	return nil
}

func (m *Main) startRetention() error {
	w, err := retention.NewWorker(m.store, m.retentionConfig())
	if err != nil {
		return err
	}
	m.ret = w
	ctx, cancel := context.WithCancel(context.Background())
	m.cancelRetention = cancel
	m.wg.Go(func() {
		if err := w.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			m.log.Error("retention worker stopped", "err", err)
		}
	})
	// Day tables a crash left uncounted are counted in the background, not by /v1/tables.
	m.wg.Go(func() { _ = m.store.RecountUnknown(ctx) })
	m.replaying.Store(len(m.store.PendingReplays()) > 0)
	m.wg.Go(func() { m.replayPending(ctx) })
	return nil
}

func (m *Main) retentionConfig() retention.Config {
	return retention.Config{
		Policy:         m.retentionPolicy(),
		Interval:       m.cfg.RetentionInterval,
		Jitter:         0.1,
		Logger:         m.log.With("component", "retention"),
		TracerProvider: m.tel.Tracer,
		MeterProvider:  m.tel.Meter,
		Now:            m.now,
	}
}

// retentionPolicy is the one policy of the worker, the admin endpoint
// and the expiry times of GET /v1/tables.
func (m *Main) retentionPolicy() retention.Policy {
	return retention.Policy{Retention: m.cfg.Retention, MaxBytes: m.cfg.RetentionMaxBytes}
}

func (m *Main) startHTTP() error {
	acfg := api.Config{
		Addr:              m.cfg.HTTPAddr,
		Reader:            m.store,
		Attributes:        m.store,
		Admin:             repairingAdmin{admin: admin{store: m.store, ret: m.ret}, m: m},
		Backups:           m.backups(),
		BackupRoot:        m.cfg.backupRoot(),
		Ready:             m.ready,
		Durability:        m.durability().Mode,
		DurabilityAck:     m.durability().Ack,
		Streams:           m.ingestConfig().Streams(),
		Metrics:           m.tel.Metrics,
		Build:             buildInfo(),
		MaxFutureSkew:     m.cfg.MaxFutureSkew,
		ResponseBudget:    m.budget.Queries,
		QueryTimeout:      m.cfg.QueryTimeout,
		ExpiresAt:         m.retentionPolicy().ExpiresAt,
		Retention:         m.cfg.Retention,
		CursorKey:         m.sec.CursorKey,
		Auth:              m.sec.Tokens(),
		TLSConfig:         m.sec.TLS,
		RateLimit:         m.cfg.Security.HTTPRate,
		RateBurst:         m.cfg.Security.HTTPBurst,
		MaxConns:          m.sec.HTTPConns,
		MaxConnsPerClient: m.cfg.Security.HTTPMaxConnsPerClient,
		Logger:            m.log.With("component", "api"),
		TracerProvider:    m.tel.Tracer,
		MeterProvider:     m.tel.Meter,
		Now:               m.now,
	}
	if err := m.withWrites(&acfg); err != nil {
		return err
	}
	if err := m.openAlerting(context.Background(), &acfg); err != nil {
		return err
	}
	if m.cluster != nil {
		if err := m.withCluster(&acfg); err != nil {
			return err
		}
	} else if err := acfg.WithDashboards(m.store); err != nil {
		return err
	}
	srv, err := api.New(acfg)
	if err != nil {
		return err
	}
	if err := srv.Open(); err != nil {
		return err
	}
	m.api = srv
	if m.alerts != nil {
		m.alerts.Run()
	}
	if m.cfg.PprofAddr != "" {
		m.pprof = pprofserve.Start(m.cfg.PprofAddr, m.log)
	}
	return nil
}

func (m *Main) window() buckets.Window {
	return buckets.Window{Retention: m.cfg.Retention, MaxFutureSkew: m.cfg.MaxFutureSkew}
}

// ready is the /readyz check: the store is open, NATS is connected and
// the ingester is consuming.
func (m *Main) ready(ctx context.Context) error {
	if err := m.store.Ping(ctx); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := m.store.CommitBlocked(ctx); err != nil {
		return err
	}
	if !m.nc.IsConnected() {
		return fmt.Errorf("nats: %s", m.nc.Status())
	}
	if m.nats != nil {
		if err := m.nats.WriteFault(); err != nil {
			return fmt.Errorf("nats: %w", err)
		}
	}
	if m.cluster != nil {
		return m.cluster.node.Ready()
	}
	for _, ing := range m.ingest {
		if err := ing.Ready(); err != nil {
			return fmt.Errorf("ingest: %w", err)
		}
	}
	return nil
}

// commitBlocked is the ingest hold of the day tables that cannot commit.
func (m *Main) commitBlocked() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return m.store.CommitBlocked(ctx)
}

// HTTPAddr is the API's actual listen address.
func (m *Main) HTTPAddr() string { return m.api.Addr() }

// NATSURL is the URL of the NATS server in use.
func (m *Main) NATSURL() string {
	if m.nats != nil {
		return m.nats.ClientURL()
	}
	return m.cfg.NATSURL
}

// MQTTAddr is the embedded MQTT listener's address, empty when it is
// off.
func (m *Main) MQTTAddr() string {
	if m.nats == nil {
		return ""
	}
	return m.nats.MQTTAddr()
}

// Close shuts down in order: stop intake and let the ingester finish
// and ack its in-flight batch, stop retention, stop HTTP, close NATS,
// close the store (every DB), then flush telemetry. It is idempotent.
func (m *Main) Close(ctx context.Context) error {
	m.closeOnce.Do(func() { m.closeErr = m.close(ctx) })
	return m.closeErr
}

func (m *Main) close(ctx context.Context) error {
	var errs []error
	m.stopIntake()
	if m.cancelIngest != nil {
		m.cancelIngest()
		select {
		case <-m.ingestDone:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("ingest did not finish its batch: %w", ctx.Err()))
		}
	}
	if m.alerts != nil {
		m.alerts.Close()
	}
	errs = append(errs, m.closeCluster(ctx))
	if m.cancelRetention != nil {
		m.cancelRetention()
	}
	if m.nats != nil {
		m.nats.StopMQTT()
	}
	if m.sec != nil {
		m.sec.Close()
	}
	if m.api != nil {
		errs = append(errs, m.api.Close(ctx))
	}
	if m.pprof != nil {
		errs = append(errs, m.pprof.Shutdown(ctx))
	}
	m.stopPace()
	m.wg.Wait()
	if m.writesNC != nil {
		m.writesNC.Close()
	}
	if m.nc != nil {
		m.nc.Close()
	}
	if m.store != nil {
		errs = append(errs, m.store.Close())
	}
	if m.nats != nil {
		m.nats.Shutdown()
	}
	if m.tel != nil {
		errs = append(errs, m.tel.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// buildInfo is what /api/v1/status/buildinfo reports: the version and
// commit -version prints (set at link time by deploy/install.sh), in
// Prometheus' form (a version without its leading v).
func buildInfo() promapi.BuildInfo {
	b := cliflag.BuildOf()
	rev := b.Commit
	if b.Dirty && rev != "" {
		rev += "-dirty"
	}
	return promapi.BuildInfo{Version: strings.TrimPrefix(b.Version, "v"), Revision: rev, BuildDate: b.Time, GoVersion: runtime.Version()}
}
