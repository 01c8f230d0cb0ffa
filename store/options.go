package store

import (
	"log/slog"
	"path/filepath"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/buckets"
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
		MemTableSize:    hotMemTableSize,
		BlockCacheSize:  hotBlockCacheSize,
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
		o.MemTableSize = hotMemTableSize
	}
	if o.BlockCacheSize <= 0 {
		o.BlockCacheSize = hotBlockCacheSize
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

// Badger tuning. A day table holds small readings (tens to hundreds of
// bytes), is written while it is hot and then mostly read, and dozens
// of them live on disk at once, so the per-table footprint matters more
// than peak write speed of any one of them.
const (
	// valueThreshold keeps blocks inside the LSM tree (no value log
	// GC, a block is read with its key); only blocks of unusually large
	// readings (long strings) go to the value log. It is Badger's
	// largest allowed threshold, and at most an eighth of a memtable
	// (Badger requires it to be below the largest transaction).
	valueThreshold = 1 << 20
	// valueLogFileSize bounds each value log file (it is mapped, and
	// preallocated sparsely, at twice this size while open).
	valueLogFileSize = 64 << 20
	// sstBlockSize is the size of a block of an SSTable. Badger's
	// default, 4 KiB, is smaller than most of the store's values (a
	// device's block, compressed, is several KiB), so each value took a
	// block of its own whose buffer Badger doubled, from 4 KiB, until it
	// fit: while a memtable was flushed its table took several times the
	// memtable's size in buffers that Badger then keeps pooled. 16 KiB
	// holds most values at once and a few of them together: a smaller
	// heap while ingesting the TSBS file and 4% less disk per value
	// (BENCHMARKS.md, Memory), for reads that decompress a block of
	// about 16 KiB instead of one value. Tables written with another
	// block size read as before.
	sstBlockSize = 16 << 10

	// A hot table takes the whole ingest stream. Every memtable flush
	// spans all devices, so each level-0 table overlaps all of level 1;
	// larger memtables, more level-0 tables per compaction and a larger
	// level 1 mean fewer rewrites of the same readings: about 45% more
	// sustained writes than 3 x 16 MiB / 4 / 10 MiB (BENCHMARKS.md). Two
	// memtables (one filling, one flushing) write as fast as three and
	// keep the memtable memory of a hot table at 64 MiB (was 48).
	hotMemTableSize    = 32 << 20 // a 10,000-reading message fits one transaction (15% of it)
	hotLevelZeroTables = 8
	hotLevelZeroStall  = 24
	hotBaseLevelSize   = 64 << 20
	hotBlockCacheSize  = 8 << 20

	coldMemTableSize   = 2 << 20 // late writes to old days are split into several commits
	coldNumMemtables   = 2
	coldBlockCacheSize = 1 << 20 // Badger needs a block cache when compression is on

	indexMemTableSize = 4 << 20
)

// HotMemtables is how many memtables of Options.MemTableSize a hot day
// table holds at once (one filling, one flushing); a memory budget
// counts them.
const HotMemtables = 2

// tableClass selects the Badger options of a DB.
type tableClass uint8

const (
	classCold tableClass = iota
	classHot
	classIndex
)

// String names the class for logs.
func (c tableClass) String() string {
	switch c {
	case classHot:
		return "hot"
	case classIndex:
		return "index"
	}
	return "cold"
}

// TableBadgerOptions returns the Badger options the store gives a hot
// (write-sized) day table in dir. Tools that measure or inspect a day
// table outside a Store, such as the benchmark's raw Badger ceiling or
// a read-only scan of a stopped service's data, use it so they see the
// same configuration. log receives Badger's warnings and errors.
func TableBadgerOptions(dir string, syncWrites, readOnly bool, log *slog.Logger) badger.Options {
	if log == nil {
		log = slog.Default()
	}
	return badgerOptions(dir, classHot, syncWrites, readOnly, log)
}

// TableDir is the directory of the table of day under the data
// directory dataDir.
func TableDir(dataDir string, day buckets.Day) string {
	return filepath.Join(dataDir, tablesDirName, day.String())
}

// badgerOptions returns the Badger options of a DB of class c in dir.
func badgerOptions(dir string, c tableClass, syncWrites, readOnly bool, log *slog.Logger) badger.Options {
	o := badger.DefaultOptions(dir).
		WithReadOnly(readOnly).
		WithLogger(badgerLogger{log: log}).
		WithSyncWrites(syncWrites).
		WithNumVersionsToKeep(1).
		WithCompression(options.ZSTD).
		WithZSTDCompressionLevel(1).
		WithValueLogFileSize(valueLogFileSize).
		WithBlockSize(sstBlockSize).
		WithDetectConflicts(false). // writers are serialized per table by the store
		WithMetricsEnabled(false).  // sizes are measured from the directory instead
		WithIndexCacheSize(0).
		WithNumCompactors(2). // the minimum that keeps compaction going
		WithCompactL0OnClose(!readOnly)
	o = withClass(o, c)
	return o.WithValueThreshold(min(valueThreshold, o.MemTableSize/8))
}

// withClass sets the sizes of a DB of class c.
func withClass(o badger.Options, c tableClass) badger.Options {
	switch c {
	case classHot:
		return o.WithMemTableSize(hotMemTableSize).
			WithNumMemtables(HotMemtables).
			WithNumLevelZeroTables(hotLevelZeroTables).
			WithNumLevelZeroTablesStall(hotLevelZeroStall).
			WithBaseLevelSize(hotBaseLevelSize).
			WithBlockCacheSize(hotBlockCacheSize)
	case classIndex:
		return o.WithMemTableSize(indexMemTableSize).
			WithNumMemtables(2).
			WithNumLevelZeroTables(2).
			WithNumLevelZeroTablesStall(8).
			WithBlockCacheSize(coldBlockCacheSize)
	default:
		return o.WithMemTableSize(coldMemTableSize).
			WithNumMemtables(coldNumMemtables).
			WithNumLevelZeroTables(2).
			WithNumLevelZeroTablesStall(8).
			WithBlockCacheSize(coldBlockCacheSize)
	}
}
