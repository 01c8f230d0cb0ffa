// Package store keeps readings in Badger, one database per UTC day
// table. Inside the table of a day a device's readings are stored in
// blocks (package store/block) keyed <device>/<inverted newest ticks>...
// (series.go), so a forward scan of a device prefix returns its newest
// readings first, and retention drops a whole day by closing its
// database and removing its directory. The formats on disk (block keys
// and blocks, the device index's records, the table's format version)
// are private to this package; README.md describes them.
//
// Layout under the data directory:
//
//	LOCK                 exclusive flock while a Store is open
//	tables/YYYY-MM-DD/   one Badger database per day table, plus its
//	                     reading count (READINGS, package countfile)
//	index/               the device index (first/last seen, latest values)
//	rollups/LEVEL/YYYY-MM/ rollups of one level and month, when on (rollups.go)
//
// Only the newest days (Options.HotDays) are opened with write-sized
// memtables. Older tables open lazily on first use with small buffers
// (read-only when they are opened for a read) and are closed again when
// idle or when more than Options.MaxOpenTables of them are open, so
// memory stays bounded however many days are kept. Listing the tables
// opens none of them.
package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/aggregate"
	"github.com/telemetryd/telemetryd/store/blocked"
	"github.com/telemetryd/telemetryd/store/colcache"
	"github.com/telemetryd/telemetryd/store/countfile"
	"github.com/telemetryd/telemetryd/store/devindex"
	"github.com/telemetryd/telemetryd/store/dirlock"
	"github.com/telemetryd/telemetryd/store/diskuse"
	"github.com/telemetryd/telemetryd/store/giveway"
	"github.com/telemetryd/telemetryd/store/replay"
	"github.com/telemetryd/telemetryd/store/settlequeue"
	"github.com/telemetryd/telemetryd/store/storemetrics"
	"github.com/telemetryd/telemetryd/store/watch"
)

// Directory names under the data directory.
const (
	tablesDirName = "tables"
	indexDirName  = "index"
	// dropPrefix marks a table directory that is being removed; Open
	// finishes removing any it finds.
	dropPrefix = ".drop-"
)

// reopenAfter is how long a table that failed to open is reported as
// unavailable before the next attempt to open it.
const reopenAfter = 30 * time.Second

// indexFlushInterval is how often index updates that do not change a
// device's day bounds are persisted.
const indexFlushInterval = time.Second

// errClosed is returned by every call on a closed Store.
var errClosed = fmt.Errorf("%w: store is closed", buckets.ErrUnavailable)

// errDropping is the cause of a TableError for a table being dropped.
var errDropping = errors.New("drop in progress")

// errReadOnly is returned by Write and DropTable on a read-only store.
var errReadOnly = errors.New("store is open read-only")

// Store is the Badger adapter: a set of day tables plus a device index.
// It is safe for concurrent use.
type Store struct {
	opts      Options
	dir       string
	tablesDir string
	log       *slog.Logger
	tracer    trace.Tracer
	metrics   *storemetrics.Metrics
	bad       *badBlocks
	lock      *dirlock.Lock
	index     *devindex.Index
	replay    *replay.State                         // stream positions and tombstones (package replay)
	barrier   atomic.Pointer[func() error]          // SetPositionBarrier (syncloop.go)
	health    blocked.Set                           // tables that cannot commit (package blocked)
	holes     atomic.Int64                          // what the memtable logs may still claim (health.go)
	deletes   replay.DeviceTombs                    // deleted devices (delete.go)
	rollups   *rollState                            // rollups (rollups.go); its set is nil when they are off
	settles   *settlequeue.Queue                    // tables the compactor settles before they close (settle.go)
	queries   giveway.Clock                         // when the last query began (giveway.go)
	cols      *colcache.Cache[*aggregate.BlockList] // decoded columns and block lists for aggregates; nil when off
	watch     watch.Set                             // told of changes to readings (watch.go)
	// lastBackup is the Unix time of the last backup that completed.
	lastBackup atomic.Int64

	mu       sync.Mutex
	tables   map[buckets.Day]*table // every day table on disk (or being created)
	closed   bool
	inflight sync.WaitGroup // references to table handles held, and drops under way
	dropSeq  int            // makes drop directory names unique
	useSeq   uint64         // counts table uses, for LRU order

	stop        chan struct{}
	done        chan struct{} // the janitor stopped
	compactDone chan struct{} // the compactor stopped
	closeOnce   sync.Once
	closeErr    error
}

// Open opens (creating if needed) the store under dataDir. It takes an
// exclusive lock on the directory (ErrLocked if another process holds
// it), opens the device index and discovers the day tables on disk
// without opening them. A damaged table does not fail Open: queries
// that touch it fail with buckets.ErrUnavailable.
func Open(ctx context.Context, dataDir string, opts Options) (*Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	s := &Store{
		opts:        opts,
		dir:         dataDir,
		tablesDir:   filepath.Join(dataDir, tablesDirName),
		log:         opts.Logger.With("component", "store"),
		tracer:      opts.TracerProvider.Tracer(instrumentationName),
		tables:      make(map[buckets.Day]*table),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
		compactDone: make(chan struct{}),
		settles:     settlequeue.New(maxSettleJobs),
		replay:      replay.New(dataDir),
	}
	s.bad = &badBlocks{log: s.log, seen: make(map[string]struct{})}
	if err := s.openFiles(); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if !opts.ReadOnly {
		if err := s.rebuildIndex(ctx); err != nil {
			s.closeAfterFailedOpen()
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	go s.janitor()
	if opts.ReadOnly {
		close(s.compactDone)
	} else {
		go s.compactor()
	}
	s.log.Info("store open", "dir", dataDir, "tables", len(s.tables), "devices", s.index.Len())
	return s, nil
}

// openFiles locks the data directory, reads the tombstones, discovers
// the day tables, opens the device index and registers the metrics.
// On failure it undoes what it did.
func (s *Store) openFiles() error {
	if !s.opts.ReadOnly {
		if err := os.MkdirAll(s.tablesDir, 0o755); err != nil {
			return err
		}
	}
	lock, err := dirlock.Dir(s.dir, s.opts.ReadOnly)
	if err != nil {
		return err
	}
	s.lock = lock
	if err := s.replay.LoadTombstones(); err != nil {
		return errors.Join(err, lock.Unlock())
	}
	if err := s.discover(); err != nil {
		return errors.Join(err, lock.Unlock())
	}
	idx, err := openIndex(filepath.Join(s.dir, indexDirName), s.opts.SyncWrites, s.opts.ReadOnly, s.log)
	if err != nil {
		return errors.Join(err, lock.Unlock())
	}
	s.index = idx
	if err := s.deletes.Load(s.index.DB(), s.opts.ReadOnly, s.log); err != nil {
		return errors.Join(err, closeIndex(idx), lock.Unlock())
	}
	if err := s.openRollups(); err != nil {
		return errors.Join(err, closeIndex(idx), lock.Unlock())
	}
	if s.opts.ColumnCacheSize > 0 {
		if s.cols, err = colcache.New[*aggregate.BlockList](s.opts.ColumnCacheSize); err != nil {
			return errors.Join(err, closeIndex(idx), s.closeRollups(), lock.Unlock())
		}
	}
	if s.metrics, err = newMetrics(s); err != nil {
		s.cols.Close()
		return errors.Join(err, closeIndex(idx), s.closeRollups(), lock.Unlock())
	}
	s.bad.start(s.metrics.CorruptBlocks)
	s.bad.damagedRecords(idx.Damaged())
	s.bad.damagedAttrRecords(idx.AttrDamaged())
	return nil
}

// closeAfterFailedOpen undoes a partial Open: the janitor is not
// running yet, so it is marked done and Close does the rest.
func (s *Store) closeAfterFailedOpen() {
	close(s.done)
	close(s.compactDone)
	s.closeOnce.Do(func() { s.closeErr = s.close() })
}

// discover registers every day table directory under tables/ without
// opening it, and finishes removing directories of interrupted drops.
func (s *Store) discover() error {
	entries, err := os.ReadDir(s.tablesDir)
	if s.opts.ReadOnly && errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, dropPrefix) {
			if s.opts.ReadOnly {
				continue
			}
			if err := os.RemoveAll(filepath.Join(s.tablesDir, name)); err != nil {
				return fmt.Errorf("finish dropping %s: %w", name, err)
			}
			continue
		}
		day, err := buckets.ParseDay(name)
		if !e.IsDir() || err != nil || day.String() != name {
			s.log.Warn("ignoring unexpected entry in tables directory", "name", name)
			continue
		}
		s.tables[day] = s.discoverTable(day, filepath.Join(s.tablesDir, name))
	}
	return nil
}

// discoverTable registers the closed table of day in dir with the count
// from its count file, if it has a valid one. An invalid one is removed.
func (s *Store) discoverTable(day buckets.Day, dir string) *table {
	t := newTable(day, dir, s.bad)
	n, ok, err := countfile.Read(dir)
	switch {
	case err != nil:
		s.log.Warn("ignoring day table reading count file", "day", day.String(), "err", err)
		if !s.opts.ReadOnly {
			if err := countfile.Remove(dir); err != nil {
				s.log.Warn("remove day table reading count file", "day", day.String(), "err", err)
			}
		}
	case ok:
		t.readings.Store(n)
		t.countFile = true
	}
	return t
}

// Close waits for running calls to release their tables, closes every
// database and releases the directory lock. It is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Store) close() error {
	close(s.stop)
	<-s.done
	<-s.compactDone
	if !s.opts.ReadOnly {
		s.compactAll(true) // merge every device's open blocks before the tables close
		if !s.opts.SyncWrites {
			s.syncAll() // and write the positions still pending (syncloop.go)
		}
	}
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.inflight.Wait()

	var errs []error
	s.mu.Lock()
	var open []*handle
	for _, t := range s.tables {
		if h := t.cur; h != nil && s.detach(h) {
			open = append(open, h)
		}
	}
	s.mu.Unlock()
	for _, h := range open {
		if err := s.end(h); err != nil {
			errs = append(errs, fmt.Errorf("close table %s: %w", h.t.day, err))
			continue // a table whose close failed keeps no count file
		}
		h.t.writeMu.Lock()
		s.saveCount(h.t)
		h.t.writeMu.Unlock()
	}
	if err := s.metrics.Unregister(); err != nil {
		errs = append(errs, err)
	}
	if err := closeIndex(s.index); err != nil {
		errs = append(errs, err)
	}
	if err := s.closeRollups(); err != nil {
		errs = append(errs, err)
	}
	s.cols.Close()
	if err := s.lock.Unlock(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Ping reports whether the store is open and usable (for readiness).
func (s *Store) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed || s.index.DB().IsClosed() {
		return errClosed
	}
	return nil
}

// janitor closes idle cold tables (handing those not settled to the
// compactor) and persists index updates until the store closes. Close
// stops it and waits for it.
func (s *Store) janitor() {
	defer close(s.done)
	every := min(max(s.opts.IdleClose/4, 10*time.Millisecond), 30*time.Second)
	sweep := time.NewTicker(every)
	defer sweep.Stop()
	flush := time.NewTicker(indexFlushInterval)
	defer flush.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-sweep.C:
			s.closeIdle()
		case <-flush.C:
			if s.diskTight(false) {
				continue // flushed once there is room (health.go)
			}
			if err := s.index.Flush(); err != nil {
				s.log.Error("persist device index", "err", err)
			}
		}
	}
}

// storeStats is what the gauges report.
type storeStats struct {
	tables, open int
	bytes        int64
}

// stats counts tables and their bytes on disk.
func (s *Store) stats() storeStats {
	s.mu.Lock()
	var st storeStats
	dirs := make([]string, 0, len(s.tables))
	for _, t := range s.tables {
		if t.dropping {
			continue
		}
		st.tables++
		if t.db != nil {
			st.open++
		}
		dirs = append(dirs, t.dir)
	}
	s.mu.Unlock()
	for _, d := range dirs {
		st.bytes += diskuse.Dir(d)
	}
	return st
}
