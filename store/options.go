package store

import (
	"log/slog"
	"time"

	"github.com/dgraph-io/badger/v4"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/store/badgeropts"
	"github.com/telemetryd/telemetryd/store/rollup"
)

// Options configures a Store. The zero value of every field means its
// default (see DefaultOptions).
type Options struct {
	// SyncWrites makes every commit fsync before Write returns, for
	// durability across power loss.
	SyncWrites bool
	// SyncEvery, without SyncWrites, fsyncs every open writable table and
	// the device index this often (syncloop.go), so a power cut loses at
	// most about that much of what was committed. 0: only when Badger
	// flushes a memtable.
	SyncEvery time.Duration
	// HotDays is how many of the newest days (today and the days before
	// it, by the clock Now) are opened with write-sized memtables.
	// Default 2.
	HotDays int
	// MaxOpenTables caps how many older (cold) day tables are open at
	// once; the least recently used idle ones are closed. Default 8.
	MaxOpenTables int
	// IdleClose closes a cold table that nobody used for this long.
	// Default 2m.
	IdleClose time.Duration
	// CompactInterval is how often the compactor looks for devices
	// whose open blocks should be merged. Default 1s.
	CompactInterval time.Duration
	// MemTableSize is the memtable size of a hot day table, in bytes;
	// a hot table keeps two (one filling, one flushing). Default 32 MiB.
	MemTableSize int64
	// BlockCacheSize is the Badger block cache of a hot day table, in
	// bytes (cold tables and the index use 1 MiB). Default 8 MiB.
	BlockCacheSize int64
	// IndexCacheSize bounds the memory of each table's SSTable indexes
	// and bloom filters, in bytes. Default 0: Badger keeps them all in
	// memory (a few hundred KiB per day table at the store's block
	// sizes).
	IndexCacheSize int64
	// ReadOnly opens every database read-only and refuses writes and
	// drops, so that inspecting a data dir (a retention dry run)
	// changes nothing on disk. It still takes the directory lock.
	ReadOnly bool
	// ColumnCacheSize bounds, in bytes, the decoded value columns of
	// blocks kept in memory for aggregates asked again (store/colcache).
	// Default 48 MiB; negative turns the cache off.
	ColumnCacheSize int64
	// Rollups are the rollup levels kept (store/rollup); none (the
	// default) turns rollups off. Validated by Open.
	Rollups []rollup.Level
	// FaultPoint, when set, is called at the points of a write where a
	// power cut is worth testing (faultpoint.go); nil in production.
	FaultPoint func(FaultPoint)

	Logger         *slog.Logger         // nil: slog.Default()
	TracerProvider trace.TracerProvider // nil: otel.GetTracerProvider()
	MeterProvider  metric.MeterProvider // nil: otel.GetMeterProvider()
	Now            func() time.Time     // nil: time.Now
}

// Defaults of Options.
const (
	defaultHotDays       = 2
	defaultMaxOpenTables = 8
	defaultIdleClose     = 2 * time.Minute
	defaultCompact       = time.Second
	// defaultColumnCache holds about 8,000 hour-long columns of a
	// device reporting every 10 s (360 values at 16 bytes each): one
	// value of 500 devices over 16 hours.
	defaultColumnCache = 48 << 20
)

// DefaultOptions returns Options with every default filled in.
func DefaultOptions() Options {
	return Options{
		HotDays:         defaultHotDays,
		MaxOpenTables:   defaultMaxOpenTables,
		IdleClose:       defaultIdleClose,
		CompactInterval: defaultCompact,
		MemTableSize:    badgeropts.HotMemTableSize,
		BlockCacheSize:  badgeropts.HotBlockCacheSize,
		ColumnCacheSize: defaultColumnCache,
	}
}

// withDefaults fills the zero fields of o.
func (o Options) withDefaults() Options {
	if o.HotDays <= 0 {
		o.HotDays = defaultHotDays
	}
	if o.MaxOpenTables <= 0 {
		o.MaxOpenTables = defaultMaxOpenTables
	}
	if o.IdleClose <= 0 {
		o.IdleClose = defaultIdleClose
	}
	if o.CompactInterval <= 0 {
		o.CompactInterval = defaultCompact
	}
	if o.MemTableSize <= 0 {
		o.MemTableSize = badgeropts.HotMemTableSize
	}
	if o.BlockCacheSize <= 0 {
		o.BlockCacheSize = badgeropts.HotBlockCacheSize
	}
	if o.ColumnCacheSize == 0 {
		o.ColumnCacheSize = defaultColumnCache
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// HotMemtables is how many memtables of Options.MemTableSize a hot day
// table holds at once (one filling, one flushing); a memory budget
// counts them.
const HotMemtables = badgeropts.HotMemtables

// TableBadgerOptions returns the Badger options the store gives a hot
// (write-sized) day table in dir. Tools that measure or inspect a day
// table outside a Store, such as the benchmark's raw Badger ceiling or
// a read-only scan of a stopped service's data, use it so they see the
// same configuration. log receives Badger's warnings and errors.
func TableBadgerOptions(dir string, syncWrites, readOnly bool, log *slog.Logger) badger.Options {
	if log == nil {
		log = slog.Default()
	}
	return badgeropts.For(dir, badgeropts.Hot, syncWrites, readOnly, log)
}
