package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/cmd/internal/alerting"
	"github.com/telemetryd/telemetryd/cmd/internal/cliflag"
	"github.com/telemetryd/telemetryd/cmd/internal/clustercfg"
	"github.com/telemetryd/telemetryd/cmd/internal/membudget"
	"github.com/telemetryd/telemetryd/cmd/internal/otelsetup"
	"github.com/telemetryd/telemetryd/cmd/internal/security"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/natsembed"
	"github.com/telemetryd/telemetryd/ingest/partition"
	"github.com/telemetryd/telemetryd/retention"
	"github.com/telemetryd/telemetryd/store"
	"github.com/telemetryd/telemetryd/store/rollup"
)

// Config is the whole service configuration. It is filled from flags,
// each of which may also be set by the environment variable
// TELEMETRY_<NAME> (upper case, '-' becomes '_'); a flag given on the
// command line wins over the environment.
type Config struct {
	DataDir           string
	HTTPAddr          string
	NATSURL           string // empty: run the embedded server
	NATSListen        string // embedded server's client listener
	SubjectPrefix     string
	Retention         time.Duration
	RetentionInterval time.Duration
	RetentionMaxBytes int64
	Rollups           string // interval:retention,... (store/rollup.ParseLevels); empty: off
	MaxFutureSkew     time.Duration
	SyncWrites        bool
	Intake            bool // with -sync-writes: answer devices' publishes, stored in atomic batches
	LogLevel          string
	LogFormat         string
	PprofAddr         string
	ShutdownTimeout   time.Duration
	HotDays           int
	MaxOpenTables     int
	ColumnCache       bool   // keep decoded block columns for aggregates asked again
	MQTTListen        string // embedded server's MQTT listener; empty: off
	LineDeviceTags    string // comma-separated tag keys naming a line's device
	LineTags          string // what a line's other tags become: attributes or values
	LineNameSeparator string // joins a line's measurement and field: _ or .
	MaxWriteBytes     int64  // largest line protocol body, before and after gunzip
	MemoryLimit       int64  // the whole process's memory budget (package membudget)
	QueryTimeout      time.Duration
	StreamMaxAge      time.Duration
	StreamMaxBytes    int64
	RejectedMaxBytes  int64
	// MQTTStreamMaxBytes bounds each of the embedded MQTT listener's
	// streams ($MQTT_sess, _msgs, _qos2in, _out, _rmsgs).
	MQTTStreamMaxBytes int64
	DiskReserve        int64 // ingest pauses while less is free under DataDir
	// StreamPartitions is the number of readings streams of a single
	// node, one per partition (-1: DefaultStreamPartitions with the
	// embedded server, 0 with -nats-url; 0: the one stream TELEMETRY).
	StreamPartitions int
	// SyncInterval bounds how long the buffered mode leaves acked
	// readings unsynced: the embedded JetStream and the store fsync
	// this often.
	SyncInterval time.Duration
	// BackupDir is the root under which POST /v1/backup may write;
	// empty means <DataDir>-backups, "off" turns online backups off
	// (see backupRoot).
	BackupDir string
	Security  security.Config
	Cluster   clustercfg.Config
	Alerting  alerting.Config

	// set names the flags given on the command line or in the
	// environment, which start-up keeps as they are (disksize.go).
	set map[string]bool
}

// DefaultStreamPartitions is a single node's number of readings
// streams with the embedded server: concurrent fsyncs of separate files
// scale to about 10x at 8 to 16 files on the machines measured
// (BENCHMARKS.md, "Fsync scaling").
const DefaultStreamPartitions = 8

// streamPartitions is the single node's number of partition streams
// (0: one stream, as in a cluster, whose partitions are -partitions).
func (c *Config) streamPartitions() int {
	switch {
	case c.Cluster.Partitions > 0:
		return 0
	case c.StreamPartitions >= 0:
		return c.StreamPartitions
	case c.NATSURL == "":
		return DefaultStreamPartitions
	}
	return 0
}

// defaultDiskReserve is the default of -disk-reserve: room for the hot
// tables' memtable flushes and compactions to finish.
const defaultDiskReserve = 256 << 20

// DefaultConfig returns the embedded, single-machine defaults. Each
// default that a library also applies is taken from the package that
// owns it, so a flag's default and the library's agree.
func DefaultConfig() Config {
	sopts := store.DefaultOptions()
	icfg := ingest.DefaultConfig()
	return Config{
		DataDir:            "./data",
		HTTPAddr:           api.DefaultAddr,
		NATSListen:         natsembed.DefaultListen,
		SubjectPrefix:      icfg.SubjectPrefix,
		Retention:          buckets.DefaultRetention,
		RetentionInterval:  retention.DefaultInterval,
		MaxFutureSkew:      buckets.DefaultMaxFutureSkew,
		LogLevel:           "info",
		LogFormat:          "text",
		ShutdownTimeout:    10 * time.Second,
		HotDays:            sopts.HotDays,
		ColumnCache:        true,
		MaxOpenTables:      sopts.MaxOpenTables,
		MQTTListen:         natsembed.DefaultMQTTListen,
		LineDeviceTags:     strings.Join(api.DefaultDeviceTags(), ","),
		LineTags:           "attributes",
		LineNameSeparator:  string(rune(linemsg.DefaultNameSeparator)),
		MaxWriteBytes:      api.DefaultMaxWriteBytes,
		MemoryLimit:        membudget.DefaultLimit,
		StreamMaxAge:       icfg.StreamMaxAge,
		StreamMaxBytes:     icfg.StreamMaxBytes,
		RejectedMaxBytes:   icfg.RejectedMaxBytes,
		MQTTStreamMaxBytes: natsembed.DefaultMQTTStreamMaxBytes,
		DiskReserve:        defaultDiskReserve,
		StreamPartitions:   -1,
		SyncInterval:       time.Second,
		SyncWrites:         true,
		Intake:             true,
		QueryTimeout:       api.DefaultQueryTimeout,
		Security:           security.Default(),
		Cluster:            clustercfg.Default(),
		Alerting:           alerting.Default(),
	}
}

// bind registers every field of c on fs, with c's values as defaults.
func (c *Config) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for day tables, the device index and the embedded NATS store")
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "HTTP API listen address")
	fs.StringVar(&c.NATSURL, "nats-url", c.NATSURL, "URL of an existing NATS server with JetStream; empty runs an embedded server")
	fs.StringVar(&c.NATSListen, "nats-listen", c.NATSListen, "client listen address of the embedded NATS server")
	fs.StringVar(&c.SubjectPrefix, "subject-prefix", c.SubjectPrefix, "readings arrive on <prefix>.<device>")
	fs.DurationVar(&c.Retention, "retention", c.Retention, "keep readings this long; a day table expires when its whole day is older")
	fs.DurationVar(&c.RetentionInterval, "retention-interval", c.RetentionInterval, "how often the retention worker runs (with jitter)")
	fs.Var(cliflag.Size(&c.RetentionMaxBytes), "retention-max-bytes", "drop the oldest days while the tables are larger than this (0 = off); today's table is never dropped")
	fs.StringVar(&c.Rollups, "rollups", c.Rollups, "keep per-device rollups (count, sum, min, max, first, last per numeric value) at these intervals for these times, e.g. 1m:90d,1h:3y; each interval divides an hour; they outlive -retention and aggregate, PromQL and chart queries read them (empty: off)")
	fs.DurationVar(&c.MaxFutureSkew, "max-future-skew", c.MaxFutureSkew, "reject readings further than this in the future")
	fs.BoolVar(&c.SyncWrites, "sync-writes", c.SyncWrites, "durability mode synced (the default): fsync Badger and the embedded JetStream before acking, so an ack survives a power cut; -sync-writes=false is mode buffered: an ack survives a crash of the process, not a power cut (the stream and the store sync every -sync-interval)")
	fs.BoolVar(&c.Intake, "intake", c.Intake, "with -sync-writes, the embedded server and streams per partition: the service answers devices' NATS publishes itself and stores them in their partition's stream as atomic batches, one fsync per batch (false: each stream takes publishes itself, one fsync per message)")
	fs.DurationVar(&c.SyncInterval, "sync-interval", c.SyncInterval, "with -sync-writes=false, the embedded JetStream and the store fsync this often: a power cut loses at most about this much of what was acked (the external NATS server's own sync_interval applies to its streams)")
	fs.IntVar(&c.StreamPartitions, "stream-partitions", c.StreamPartitions, "a single node's readings streams, one per partition of the devices (TELEMETRY_0, TELEMETRY_1, ...), each with its own file and fsync; -1: "+strconv.Itoa(DefaultStreamPartitions)+" with the embedded server, 0 (the one stream TELEMETRY) with -nats-url, whose server must map <prefix>.* to <prefix>.{{partition(N,1)}}.{{wildcard(1)}} for N > 0")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	fs.StringVar(&c.PprofAddr, "pprof-addr", c.PprofAddr, "serve net/http/pprof on this address (empty: off)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "longest graceful shutdown before giving up")
	fs.IntVar(&c.HotDays, "hot-days", c.HotDays, "newest days kept open with write-sized memtables")
	fs.IntVar(&c.MaxOpenTables, "max-open-tables", c.MaxOpenTables, "most older day tables kept open at once (closed when idle)")
	fs.BoolVar(&c.ColumnCache, "column-cache", c.ColumnCache, "keep the decoded value columns and block lists that aggregates and PromQL windows read (5% of -memory-limit), so a question asked again (a dashboard refresh, a rule) folds values instead of decompressing blocks; false frees that memory")
	fs.StringVar(&c.MQTTListen, "mqtt-listen", c.MQTTListen, "MQTT 3.1.1 listener of the embedded NATS server: topic <prefix>/<device>, QoS 0, 1 and 2 (empty: off; ignored with -nats-url)")
	fs.StringVar(&c.LineDeviceTags, "line-device-tags", c.LineDeviceTags, "line protocol writes: the first of these tags present on a line names its device")
	fs.StringVar(&c.LineTags, "line-tags", c.LineTags, "line protocol writes: a line's other tags become attributes of its device as of the line's time (attributes), or string values <measurement>_<tag> of its reading (values)")
	fs.StringVar(&c.LineNameSeparator, "line-name-separator", c.LineNameSeparator, "line protocol writes: joins a line's measurement and field into a value name: _ (climate_temp) or . (climate.temp; PromQL quotes such names: {\"climate.temp\"}); stored names never change")
	fs.Var(cliflag.Size(&c.MaxWriteBytes), "max-write-bytes", "largest line protocol write body, before and after gunzip (past it: 413)")
	fs.Var(cliflag.Size(&c.MemoryLimit), "memory-limit", "memory budget of the whole process (512MiB, 2GiB, ...): the Go runtime's soft limit, its GC pacing (the heap grows by at most 15% of it past what is live, unless GOGC is set), memtables, caches, the embedded JetStream's memory, consumer buffers and query responses are sized from it")
	fs.DurationVar(&c.QueryTimeout, "query-timeout", c.QueryTimeout, "longest a query may take, parsing and evaluation alike (past it: 503)")
	fs.DurationVar(&c.StreamMaxAge, "stream-max-age", c.StreamMaxAge, "the readings streams (TELEMETRY_0.. or TELEMETRY) keep messages at most this long (the replay buffer)")
	fs.Var(cliflag.Size(&c.StreamMaxBytes), "stream-max-bytes", "disk space of the readings streams, an equal part for each partition's stream; a full stream refuses publishes (clients retry) and settled messages are purged from 80% of it")
	fs.Var(cliflag.Size(&c.RejectedMaxBytes), "rejected-max-bytes", "disk space of the TELEMETRY_REJECTED dead-letter stream; past it the oldest dead letters are removed")
	fs.Var(cliflag.Size(&c.MQTTStreamMaxBytes), "mqtt-stream-max-bytes", "disk space of each of the embedded MQTT listener's streams ($MQTT_*); when one is full, the MQTT publishes that need it are refused (the connection is closed; clients reconnect and retry)")
	fs.StringVar(&c.BackupDir, "backup-dir", c.BackupDir, "absolute directory under which POST /v1/backup may write backups (the request names a directory inside it); empty: <data-dir>-backups beside the data dir; off: online backups are off (501)")
	fs.Var(cliflag.Size(&c.DiskReserve), "disk-reserve", "ingest pauses (stops acking, /readyz 503) while the data dir's file system has less free space than this, and resumes by itself (0: off)")
	c.Security.Bind(fs)
	c.Cluster.Bind(fs)
	c.Alerting.Bind(fs)
}

// Validate checks the values that flags cannot check alone.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("-data-dir must not be empty"))
	}
	if c.BackupDir != "" && c.BackupDir != backupsOff && (!filepath.IsAbs(c.BackupDir) || filepath.Clean(c.BackupDir) != c.BackupDir) {
		errs = append(errs, fmt.Errorf("-backup-dir %q must be a clean absolute path (or off)", c.BackupDir))
	}
	if c.Retention <= 0 {
		errs = append(errs, fmt.Errorf("-retention %s must be positive", c.Retention))
	}
	if c.RetentionInterval <= 0 {
		errs = append(errs, fmt.Errorf("-retention-interval %s must be positive", c.RetentionInterval))
	}
	if c.RetentionMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("-retention-max-bytes %d must not be negative", c.RetentionMaxBytes))
	}
	if _, err := rollup.ParseLevels(c.Rollups); err != nil {
		errs = append(errs, fmt.Errorf("-rollups: %w", err))
	}
	if c.MaxFutureSkew < 0 {
		errs = append(errs, fmt.Errorf("-max-future-skew %s must not be negative", c.MaxFutureSkew))
	}
	if err := ingest.ValidateSubjectPrefix(c.SubjectPrefix); err != nil {
		errs = append(errs, fmt.Errorf("-subject-prefix: %w", err))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("-log-format %q must be text or json", c.LogFormat))
	}
	if c.NATSURL == "" {
		if _, _, err := natsembed.SplitListen(c.NATSListen); err != nil {
			errs = append(errs, fmt.Errorf("-nats-listen %w", err))
		}
	}
	if c.MQTTListen != "" {
		if _, _, err := natsembed.SplitListen(c.MQTTListen); err != nil {
			errs = append(errs, fmt.Errorf("-mqtt-listen %w", err))
		}
	}
	if _, err := c.lineDeviceTags(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.lineTags(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.lineNameSeparator(); err != nil {
		errs = append(errs, err)
	}
	if c.MaxWriteBytes < 1 {
		errs = append(errs, fmt.Errorf("-max-write-bytes %d must be positive", c.MaxWriteBytes))
	}
	if _, err := membudget.Plan(c.MemoryLimit, max(c.HotDays, 1), max(c.MaxOpenTables, 1), max(c.MaxWriteBytes, 1)); err != nil {
		errs = append(errs, err)
	}
	if c.QueryTimeout <= 0 {
		errs = append(errs, fmt.Errorf("-query-timeout %v must be positive", c.QueryTimeout))
	}
	if c.DiskReserve < 0 {
		errs = append(errs, fmt.Errorf("-disk-reserve %d must not be negative", c.DiskReserve))
	}
	if c.StreamMaxAge <= 0 {
		errs = append(errs, fmt.Errorf("-stream-max-age %s must be positive", c.StreamMaxAge))
	}
	if c.StreamMaxBytes < 1<<20 || c.RejectedMaxBytes < 1<<20 || c.MQTTStreamMaxBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("-stream-max-bytes %s, -rejected-max-bytes %s and -mqtt-stream-max-bytes %s must be at least 1MiB",
			cliflag.FormatBytes(c.StreamMaxBytes), cliflag.FormatBytes(c.RejectedMaxBytes), cliflag.FormatBytes(c.MQTTStreamMaxBytes)))
	}
	if c.SyncInterval <= 0 {
		errs = append(errs, fmt.Errorf("-sync-interval %s must be positive", c.SyncInterval))
	}
	if c.StreamPartitions < -1 || c.StreamPartitions > partition.Max {
		errs = append(errs, fmt.Errorf("-stream-partitions %d: want 0 to %d", c.StreamPartitions, partition.Max))
	}
	if c.StreamPartitions > 0 && c.Cluster.Partitions > 0 {
		errs = append(errs, errors.New("-stream-partitions is a single node's; a cluster's streams follow -partitions"))
	}
	if c.HotDays < 1 || c.MaxOpenTables < 1 {
		errs = append(errs, errors.New("-hot-days and -max-open-tables must be at least 1"))
	}
	errs = append(errs, c.validateSecurity(), c.validateCluster(), c.Alerting.Validate())
	return errors.Join(errs...)
}

// lineDeviceTags splits -line-device-tags.
func (c *Config) lineDeviceTags() ([]string, error) {
	tags, err := linemsg.ParseDeviceTags(c.LineDeviceTags)
	if err != nil {
		return nil, fmt.Errorf("-line-device-tags %w", err)
	}
	return tags, nil
}

// lineTags parses -line-tags.
func (c *Config) lineTags() (linemsg.TagMode, error) {
	mode, err := linemsg.ParseTagMode(c.LineTags)
	if err != nil {
		return 0, fmt.Errorf("-line-tags %w", err)
	}
	return mode, nil
}

// parseFlags fills c from args and the environment. Flags set on the
// command line win; otherwise TELEMETRY_<NAME> applies.
func (c *Config) parseFlags(name string, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	c.bind(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	setServiceUsage(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		return errVersion
	}
	if err := applyEnv(fs, c, getenv); err != nil {
		return err
	}
	c.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.set[f.Name] = true })
	return nil
}

// envPrefix starts the environment variable of every flag.
const envPrefix = "TELEMETRY_"

// bindRetention registers the flags that `telemetryd retention` uses:
// the data dir, the policy and the log.
func (c *Config) bindRetention(fs *flag.FlagSet) {
	c.bindSubset(fs, "data-dir", "retention", "retention-max-bytes", "log-level", "log-format")
}

// bindSubset registers on fs the service's flags of those names, bound
// to c, for a subcommand that needs only them.
func (c *Config) bindSubset(fs *flag.FlagSet, names ...string) {
	all := flag.NewFlagSet("", flag.ContinueOnError)
	c.bind(all)
	for _, name := range names {
		f := all.Lookup(name)
		fs.Var(f.Value, f.Name, f.Usage)
	}
}

// parseSubcommand parses args into fs, then the environment into c,
// for a subcommand named by fs. When the subcommand should stop (-h,
// or a bad flag, reported on stderr) ok is false and code its exit
// status.
func parseSubcommand(fs *flag.FlagSet, args []string, c *Config, getenv func(string) string, stderr io.Writer) (code int, ok bool) {
	err := fs.Parse(args)
	if err == nil {
		err = applyEnv(fs, c, getenv)
	}
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		return 0, false
	default:
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return 2, false
	}
}

// applyEnv applies the TELEMETRY_* environment to every flag of fs
// (which c is bound to, and which has parsed its arguments) that was
// not given, and validates c.
func applyEnv(fs *flag.FlagSet, c *Config, getenv func(string) string) error {
	if err := cliflag.ApplyEnv(fs, envPrefix, getenv); err != nil {
		return err
	}
	return c.Validate()
}

// envName maps a flag name to its environment variable.
func envName(flag string) string { return cliflag.EnvName(envPrefix, flag) }

func parseLevel(s string) (slog.Level, error) {
	l, err := otelsetup.ParseLevel(s)
	if err != nil {
		return 0, fmt.Errorf("-log-level %w", err)
	}
	return l, nil
}

// newLogger builds the service logger (otelsetup.NewLogger).
func newLogger(c Config, w io.Writer) *slog.Logger {
	return otelsetup.NewLogger(c.LogLevel, c.LogFormat, w)
}

// lineNameSeparator parses -line-name-separator.
func (c *Config) lineNameSeparator() (byte, error) {
	sep, err := linemsg.ParseNameSeparator(c.LineNameSeparator)
	if err != nil {
		return 0, fmt.Errorf("-line-name-separator %w", err)
	}
	return sep, nil
}
