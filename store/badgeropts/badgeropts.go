// Package badgeropts holds the Badger options of the store's databases:
// day tables while they take writes (hot) and after (cold), the device
// index, and the rollup period databases, with the logger that passes
// Badger's warnings and errors to slog; and opens them (Open,
// OpenManaged) with panics turned into errors, past the empty log files
// a power cut can leave, and read-only through a temporary copy when
// they were not closed cleanly (OpenView).
package badgeropts

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// Badger tuning. A day table holds small readings (tens to hundreds of
// bytes), is written while it is hot and then mostly read, and dozens
// of them live on disk at once, so the per-table footprint matters more
// than peak write speed of any one of them.
const (
	// ValueThreshold keeps blocks inside the LSM tree (no value log
	// GC, a block is read with its key); only blocks of unusually large
	// readings (long strings) go to the value log. It is Badger's
	// largest allowed threshold, and at most an eighth of a memtable
	// (Badger requires it to be below the largest transaction).
	ValueThreshold = 1 << 20
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
	HotMemTableSize    = 32 << 20 // a 10,000-reading message fits one transaction (15% of it)
	hotLevelZeroTables = 8
	hotLevelZeroStall  = 24
	hotBaseLevelSize   = 64 << 20
	HotBlockCacheSize  = 8 << 20

	coldMemTableSize   = 2 << 20 // late writes to old days are split into several commits
	coldNumMemtables   = 2
	coldBlockCacheSize = 1 << 20 // Badger needs a block cache when compression is on

	indexMemTableSize = 4 << 20
)

// HotMemtables is how many memtables of the store's MemTableSize a hot day
// table holds at once (one filling, one flushing); a memory budget
// counts them.
const HotMemtables = 2

// Class selects the Badger options of a DB.
type Class uint8

const (
	Cold  Class = iota // a day table past its hot days
	Hot                // a day table taking writes
	Index              // the device index
)

// String names the class for logs.
func (c Class) String() string {
	switch c {
	case Hot:
		return "hot"
	case Index:
		return "index"
	}
	return "cold"
}

// rollupMemTableSize is the memtable of a rollup database (one at a
// time while it fills, two while it flushes). A record larger than an
// eighth of it (an hour of minutes of about 150 values) is kept in the
// value log, so a wide device's hour still fits one transaction.
const rollupMemTableSize = 4 << 20

// rollupBlockSize is the SSTable block of a rollup database. A record
// (a day of hourly buckets of four values is about 5.5 kB) is larger
// than Badger's default 4 kB block, so each record and each older
// version of it not yet compacted away took a block of its own, and a
// long read allocated one block header per record and version; a
// year-long hourly chart met about 1,700 of them. Uncompressed and
// without a block cache, a larger block costs a point read nothing.
const rollupBlockSize = 64 << 10

// For returns the Badger options of a DB of class c in dir. log
// receives Badger's warnings and errors.
func For(dir string, c Class, syncWrites, readOnly bool, log *slog.Logger) badger.Options {
	o := badger.DefaultOptions(dir).
		WithReadOnly(readOnly).
		WithLogger(Logger{Log: log}).
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
	return o.WithValueThreshold(min(ValueThreshold, o.MemTableSize/8))
}

// withClass sets the sizes of a DB of class c.
func withClass(o badger.Options, c Class) badger.Options {
	switch c {
	case Hot:
		return o.WithMemTableSize(HotMemTableSize).
			WithNumMemtables(HotMemtables).
			WithNumLevelZeroTables(hotLevelZeroTables).
			WithNumLevelZeroTablesStall(hotLevelZeroStall).
			WithBaseLevelSize(hotBaseLevelSize).
			WithBlockCacheSize(HotBlockCacheSize)
	case Index:
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

// Rollup returns the options of a rollup period database in dir (as
// opened, backed up and restored).
func Rollup(dir string, syncWrites, readOnly bool, log *slog.Logger) badger.Options {
	// Uncompressed: a long read then needs no block cache to stay fast
	// (summaries are floats, which compress little).
	o := For(dir, Cold, syncWrites, readOnly, log).WithMemTableSize(rollupMemTableSize).
		WithCompression(options.None).WithBlockCacheSize(0).WithBlockSize(rollupBlockSize)
	return o.WithValueThreshold(min(ValueThreshold, o.MemTableSize/8))
}

// Logger sends Badger's errors and warnings to slog and drops its
// chatty info and debug lines.
type Logger struct {
	Log *slog.Logger
}

// Errorf implements badger.Logger.
func (l Logger) Errorf(format string, args ...any) {
	l.Log.Error("badger: " + strings.TrimSpace(fmt.Sprintf(format, args...)))
}

// Warningf implements badger.Logger.
func (l Logger) Warningf(format string, args ...any) {
	l.Log.Warn("badger: " + strings.TrimSpace(fmt.Sprintf(format, args...)))
}

// Infof implements badger.Logger; it is dropped.
func (Logger) Infof(string, ...any) {}

// Debugf implements badger.Logger; it is dropped.
func (Logger) Debugf(string, ...any) {}

// Open is badger.Open with panics turned into errors, past the
// empty files a power cut can leave (openSizingEmptyFiles).
func Open(opts badger.Options) (db *badger.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("badger panicked: %v", r)
		}
	}()
	return openSizingEmptyFiles(opts, badger.Open)
}

// OpenManaged opens a day table's database in managed mode, with
// panics turned into errors, past the empty files a power cut can leave
// (openSizingEmptyFiles).
func OpenManaged(opts badger.Options) (db *badger.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("badger panicked: %v", r)
		}
	}()
	return openSizingEmptyFiles(opts, badger.OpenManaged)
}

// badgerNewFile ends the error badger.Open returns for a memtable or
// value log file it found empty: the text of ristretto's z.NewFile,
// which Badger formats into its error (errors.Is cannot see it).
const badgerNewFile = "Create a new file"

// maxEmptyFileReopens bounds the reopens of openSizingEmptyFiles: each
// one gets past one empty file.
const maxEmptyFileReopens = 8

// openSizingEmptyFiles opens a Badger database with open, and opens it
// again while open fails on a write-ahead log (*.mem) or value log
// (*.vlog) file it found empty. Badger creates those files and sizes
// them with ftruncate, but nothing makes the size durable before the
// first synced write into the file; a power cut before that leaves the
// file empty, and badger.Open then fails after sizing it
// (dgraph-io/badger#2207). The sized file holds zeros, that is no
// entries, so the next open goes past it: nothing that was synced is
// skipped.
func openSizingEmptyFiles(opts badger.Options, open func(badger.Options) (*badger.DB, error)) (*badger.DB, error) {
	db, err := open(opts)
	for i := 0; err != nil && strings.HasSuffix(err.Error(), badgerNewFile) && i < maxEmptyFileReopens; i++ {
		if opts.Logger != nil {
			opts.Logger.Warningf("reopening %s: %v", opts.Dir, err)
		}
		db, err = open(opts)
	}
	return db, err
}

// ClosedCleanly reports whether the Badger database in dir was closed
// cleanly: it has no write-ahead log (*.mem) files, which Badger
// removes on Close after flushing them.
func ClosedCleanly(dir string) bool {
	mems, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	return err == nil && len(mems) == 0
}
