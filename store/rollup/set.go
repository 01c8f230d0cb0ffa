package rollup

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/diskuse"
)

// Options configures a Set.
type Options struct {
	// Levels are the rollups kept; at least one.
	Levels []Level
	// Badger returns the options of a period database in dir.
	Badger func(dir string) badger.Options
	// MaxOpen caps the period databases open at once; the least
	// recently used idle ones are closed past it. Default 16.
	MaxOpen int
	Logger  *slog.Logger // nil: slog.Default()
}

// DefaultMaxOpen is the default of Options.MaxOpen.
const DefaultMaxOpen = 16

// Set is the rollups of a data directory: per level, one Badger
// database per period (<dir>/<level>/YYYY-MM, named by its first
// month): a UTC month for levels under an hour, a UTC year for the
// others (Level.months), opened on first use.
// It is safe for concurrent use.
type Set struct {
	dir    string
	levels []Level
	opts   Options
	log    *slog.Logger

	writeMu sync.Mutex // serialises Put, a read-modify-write

	mu      sync.Mutex
	periods map[periodKey]*period // every period on disk or being made
	useSeq  uint64
	closed  bool

	sweeps sync.WaitGroup // closeIdle calls under way (sweepLater)
}

// periodKey names a period database: a level (index) and its first
// month (year*12 + month-1).
type periodKey struct {
	level int
	month int
}

// period is one period database. Users hold rw for reading; closing
// and dropping it take rw for writing, so they wait for users.
type period struct {
	key     periodKey
	dir     string
	rw      sync.RWMutex
	openMu  sync.Mutex
	db      atomic.Pointer[badger.DB]
	lastUse uint64 // guarded by Set.mu
}

// Open opens the rollups under dir (creating it), finding the period
// databases already there without opening them.
func Open(dir string, opts Options) (*Set, error) {
	if err := ValidateLevels(opts.Levels); err != nil {
		return nil, err
	}
	if len(opts.Levels) == 0 || opts.Badger == nil {
		return nil, errors.New("rollup: Open needs levels and Badger options")
	}
	if opts.MaxOpen <= 0 {
		opts.MaxOpen = DefaultMaxOpen
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Set{dir: dir, levels: slices.Clone(opts.Levels), opts: opts, log: opts.Logger, periods: make(map[periodKey]*period)}
	for i, l := range s.levels {
		ld := filepath.Join(dir, l.Name())
		if err := os.MkdirAll(ld, 0o755); err != nil {
			return nil, fmt.Errorf("rollup: %w", err)
		}
		ents, err := os.ReadDir(ld)
		if err != nil {
			return nil, fmt.Errorf("rollup: %w", err)
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			if len(e.Name()) > len(dropPrefix) && e.Name()[:len(dropPrefix)] == dropPrefix {
				if err := os.RemoveAll(filepath.Join(ld, e.Name())); err != nil {
					return nil, fmt.Errorf("rollup: finish drop: %w", err)
				}
				continue
			}
			t, err := time.Parse(monthLayout, e.Name())
			if err != nil {
				continue
			}
			k := periodKey{level: i, month: monthOf(buckets.MustTicks(t))}
			s.periods[k] = &period{key: k, dir: filepath.Join(ld, e.Name())}
		}
	}
	return s, nil
}

// monthLayout names a period directory.
const monthLayout = "2006-01"

// dropPrefix marks a period directory being removed.
const dropPrefix = ".drop-"

// Levels returns the levels, sorted by interval.
func (s *Set) Levels() []Level { return s.levels }

// monthOf numbers the UTC month of k.
func monthOf(k buckets.Ticks) int {
	t := k.Time()
	return t.Year()*12 + int(t.Month()) - 1
}

// monthStart is the start of month m.
func monthStart(m int) buckets.Ticks {
	return buckets.MustTicks(time.Date(m/12, time.Month(m%12+1), 1, 0, 0, 0, 0, time.UTC))
}

// use returns the period of k, open and held for reading, and the
// function that lets go of it. Without create a period that does not
// exist is nil.
func (s *Set) use(k periodKey, create bool) (*period, func(), error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: rollups are closed", buckets.ErrUnavailable)
	}
	p := s.periods[k]
	if p == nil {
		if !create {
			s.mu.Unlock()
			return nil, func() {}, nil
		}
		p = &period{key: k, dir: filepath.Join(s.dir, s.levels[k.level].Name(), monthStart(k.month).Time().Format(monthLayout))}
		s.periods[k] = p
	}
	s.useSeq++
	p.lastUse = s.useSeq
	s.mu.Unlock()
	p.rw.RLock()
	if p.db.Load() == nil {
		p.openMu.Lock()
		if p.db.Load() == nil {
			db, err := badger.Open(s.opts.Badger(p.dir))
			if err != nil {
				p.openMu.Unlock()
				p.rw.RUnlock()
				return nil, nil, fmt.Errorf("%w: open rollup %s: %v", buckets.ErrUnavailable, p.dir, err)
			}
			p.db.Store(db)
			s.sweepLater(p)
		}
		p.openMu.Unlock()
	}
	return p, p.rw.RUnlock, nil
}

// sweepLater runs closeIdle on a goroutine of its own, so that a reader
// that opened a period never closes another: closing a period database
// flushes its memtable and compacts its level 0. The caller holds
// keep.rw for reading, which keeps Close from passing keep before the
// sweep is counted.
func (s *Set) sweepLater(keep *period) {
	s.sweeps.Add(1)
	go func() {
		defer s.sweeps.Done()
		s.closeIdle(keep)
	}()
}

// closeIdle closes the least recently used idle databases past
// MaxOpen, other than keep.
func (s *Set) closeIdle(keep *period) {
	s.mu.Lock()
	var open []*period
	for _, p := range s.periods {
		if p != keep && p.db.Load() != nil {
			open = append(open, p)
		}
	}
	s.mu.Unlock()
	if len(open)+1 <= s.opts.MaxOpen {
		return
	}
	slices.SortFunc(open, func(a, b *period) int { return int(a.lastUse) - int(b.lastUse) })
	for _, p := range open[:len(open)+1-s.opts.MaxOpen] {
		if p.rw.TryLock() {
			s.closeDB(p)
			p.rw.Unlock()
		}
	}
}

// closeDB closes p's database; rw is held for writing.
func (s *Set) closeDB(p *period) error {
	db := p.db.Swap(nil)
	if db == nil {
		return nil
	}
	if err := db.Close(); err != nil {
		s.log.Error("close rollup period", "dir", p.dir, "err", err)
		return fmt.Errorf("close rollup %s: %w", p.dir, err)
	}
	return nil
}

// recordKey is the key of dev's record of the span at start.
func recordKey(dev buckets.DeviceID, start buckets.Ticks) []byte {
	k := make([]byte, 0, len(dev)+9)
	k = append(k, dev...)
	k = append(k, '/')
	return binary.BigEndian.AppendUint64(k, uint64(start))
}

// markKey is the key of dev's mark for day.
func markKey(dev buckets.DeviceID, day buckets.Day) []byte {
	k := append([]byte("\x00mark/"), dev...)
	k = append(k, '/')
	return binary.BigEndian.AppendUint32(k, uint32(day))
}

// Put replaces dev's buckets of level with start in [lo, hi), a range
// of whole windows within one UTC day, with bs (oldest first, in the
// range), and raises dev's mark for that day to at least mark. The
// store sets the mark to a time before which every window of the day
// has been put as it is.
//
// Long: the read, merge and write of each record share one transaction.
func (s *Set) Put(ctx context.Context, level int, dev buckets.DeviceID, lo, hi buckets.Ticks, bs []Bucket, mark buckets.Ticks) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l := s.levels[level]
	day := buckets.DayOf(lo)
	if lo%windowTicks != 0 || hi%windowTicks != 0 || lo >= hi || buckets.DayOf(hi-1) != day {
		return fmt.Errorf("rollup put %s..%s: not whole windows of one day", lo.FormatTime(), hi.FormatTime())
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	p, done, err := s.use(periodKey{level: level, month: l.periodOf(lo)}, true)
	if err != nil {
		return err
	}
	defer done()
	iv, span := l.ticks(), l.span()
	err = p.db.Load().Update(func(txn *badger.Txn) error {
		for ss := lo - lo%span; ss < hi; ss += span {
			key := recordKey(dev, ss)
			var keep []Bucket
			item, err := txn.Get(key)
			switch {
			case errors.Is(err, badger.ErrKeyNotFound):
			case err != nil:
				return err
			default:
				err = item.Value(func(v []byte) error {
					return decodeRecord(v, ss, iv, span, &decoder{}, func(b Bucket) error {
						if b.Start < lo || b.Start >= hi {
							keep = append(keep, b)
						}
						return nil
					})
				})
				if err != nil {
					return fmt.Errorf("record %s of %s: %w", ss.FormatTime(), dev, err)
				}
			}
			for _, b := range bs {
				if b.Start >= ss && b.Start < ss+span {
					keep = append(keep, b)
				}
			}
			if len(keep) == 0 {
				if err := txn.Delete(key); err != nil {
					return err
				}
				continue
			}
			slices.SortFunc(keep, func(a, b Bucket) int { return int((a.Start - b.Start) / iv) })
			if err := txn.Set(key, appendRecord(nil, ss, iv, keep)); err != nil {
				return err
			}
		}
		return raiseMark(txn, markKey(dev, day), mark)
	})
	if err != nil {
		return fmt.Errorf("rollup %s put %s: %w", l.Name(), dev, err)
	}
	return nil
}

// RaiseMark raises dev's mark of level for day to at least mark.
func (s *Set) RaiseMark(ctx context.Context, level int, dev buckets.DeviceID, day buckets.Day, mark buckets.Ticks) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	p, done, err := s.use(periodKey{level: level, month: s.levels[level].periodOf(day.Start())}, true)
	if err != nil {
		return err
	}
	defer done()
	err = p.db.Load().Update(func(txn *badger.Txn) error { return raiseMark(txn, markKey(dev, day), mark) })
	if err != nil {
		return fmt.Errorf("rollup %s mark of %s: %w", s.levels[level].Name(), dev, err)
	}
	return nil
}

// raiseMark sets the mark at key to mark unless it is higher already.
func raiseMark(txn *badger.Txn, key []byte, mark buckets.Ticks) error {
	old, err := getMark(txn, key)
	if err != nil || old >= mark {
		return err
	}
	return txn.Set(key, binary.BigEndian.AppendUint64(nil, uint64(mark)))
}

// getMark reads the mark at key, -1 when there is none.
func getMark(txn *badger.Txn, key []byte) (buckets.Ticks, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return -1, nil
	}
	if err != nil {
		return -1, err
	}
	var m buckets.Ticks = -1
	err = item.Value(func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("%w: mark of %d bytes", ErrCorrupt, len(v))
		}
		m = buckets.Ticks(binary.BigEndian.Uint64(v))
		return nil
	})
	return m, err
}

// Mark returns dev's mark of level for day: every window of the day
// before it was put as the day table held it (-1 when nothing was put).
func (s *Set) Mark(level int, dev buckets.DeviceID, day buckets.Day) (buckets.Ticks, error) {
	p, done, err := s.use(periodKey{level: level, month: s.levels[level].periodOf(day.Start())}, false)
	if err != nil || p == nil {
		return -1, err
	}
	defer done()
	var m buckets.Ticks
	err = p.db.Load().View(func(txn *badger.Txn) error {
		m, err = getMark(txn, markKey(dev, day))
		return err
	})
	return m, err
}

// Marks returns dev's marks of level for the days first to last, the
// mark of day d at d-first (-1 for a day without one), read with one
// iteration per period rather than a lookup per day.
func (s *Set) Marks(level int, dev buckets.DeviceID, first, last buckets.Day) ([]buckets.Ticks, error) {
	if last < first {
		return nil, nil
	}
	ms := make([]buckets.Ticks, last-first+1)
	for i := range ms {
		ms[i] = -1
	}
	l := s.levels[level]
	for m := l.periodOf(first.Start()); m <= l.periodOf(last.Start()); m += l.months() {
		if err := s.marksIn(periodKey{level: level, month: m}, dev, first, last, ms); err != nil {
			return nil, fmt.Errorf("rollup %s marks of %s: %w", l.Name(), dev, err)
		}
	}
	return ms, nil
}

// marksIn is Marks within one period.
func (s *Set) marksIn(k periodKey, dev buckets.DeviceID, first, last buckets.Day, ms []buckets.Ticks) error {
	p, done, err := s.use(k, false)
	if err != nil || p == nil {
		return err
	}
	defer done()
	return p.db.Load().View(func(txn *badger.Txn) error {
		seek := markKey(dev, first)
		prefix := seek[:len(seek)-4]
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(seek); it.Valid(); it.Next() {
			key := it.Item().Key()
			if len(key) != len(prefix)+4 { // another device's
				continue
			}
			d := buckets.Day(binary.BigEndian.Uint32(key[len(prefix):]))
			if d > last {
				return nil
			}
			if d < first {
				continue
			}
			err := it.Item().Value(func(v []byte) error {
				if len(v) != 8 {
					return fmt.Errorf("%w: mark of %d bytes", ErrCorrupt, len(v))
				}
				ms[d-first] = buckets.Ticks(binary.BigEndian.Uint64(v))
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// Scan calls fn for each of dev's buckets of level with start in
// [lo, hi), oldest first.
func (s *Set) Scan(ctx context.Context, level int, dev buckets.DeviceID, lo, hi buckets.Ticks, fn func(Bucket) error) error {
	return s.ScanNames(ctx, level, dev, lo, hi, nil, fn)
}

// ScanNames is Scan with each bucket's Values narrowed to the names in
// want (nil: every name); a bucket with none of them is left out.
func (s *Set) ScanNames(ctx context.Context, level int, dev buckets.DeviceID, lo, hi buckets.Ticks, want map[string]bool, fn func(Bucket) error) error {
	if lo >= hi {
		return nil
	}
	l := s.levels[level]
	iv, span := l.ticks(), l.span()
	d := &decoder{lo: lo, hi: hi, want: want}
	for m := l.periodOf(lo); m <= l.periodOf(hi-1); m += l.months() {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := s.scanPeriod(periodKey{level: level, month: m}, dev, d, iv, span, max(lo, monthStart(m)), min(hi, monthStart(m+l.months())), fn)
		if err != nil {
			return fmt.Errorf("rollup %s of %s: %w", l.Name(), dev, err)
		}
	}
	return nil
}

// scanPeriod is Scan within one period.
func (s *Set) scanPeriod(k periodKey, dev buckets.DeviceID, d *decoder, iv, span, lo, hi buckets.Ticks, fn func(Bucket) error) error {
	p, done, err := s.use(k, false)
	if err != nil || p == nil {
		return err
	}
	defer done()
	return p.db.Load().View(func(txn *badger.Txn) error {
		prefix := append([]byte(dev), '/')
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: false})
		defer it.Close()
		for it.Seek(recordKey(dev, lo-lo%span)); it.Valid(); it.Next() {
			key := it.Item().Key()
			if len(key) != len(prefix)+8 || !bytes.HasPrefix(key, prefix) {
				continue
			}
			ss := buckets.Ticks(binary.BigEndian.Uint64(key[len(prefix):]))
			if ss >= hi {
				return nil
			}
			err := it.Item().Value(func(v []byte) error {
				return decodeRecord(v, ss, iv, span, d, func(b Bucket) error {
					if b.Start < lo || b.Start >= hi {
						return nil
					}
					return fn(b)
				})
			})
			if err != nil {
				return fmt.Errorf("record %s: %w", ss.FormatTime(), err)
			}
		}
		return nil
	})
}

// Period describes one period database.
type Period struct {
	Level     Level
	Month     time.Time // its first instant
	SizeBytes int64
	// Expires is when the whole period is older than the level's
	// retention.
	Expires time.Time
}

// Periods lists the period databases on disk, by level then month.
func (s *Set) Periods() []Period {
	s.mu.Lock()
	keys := make([]*period, 0, len(s.periods))
	for _, p := range s.periods {
		keys = append(keys, p)
	}
	s.mu.Unlock()
	slices.SortFunc(keys, func(a, b *period) int {
		if a.key.level != b.key.level {
			return a.key.level - b.key.level
		}
		return a.key.month - b.key.month
	})
	out := make([]Period, 0, len(keys))
	for _, p := range keys {
		l := s.levels[p.key.level]
		out = append(out, Period{Level: l, Month: monthStart(p.key.month).Time(), SizeBytes: diskuse.Dir(p.dir),
			Expires: monthStart(p.key.month + l.months()).Time().Add(l.Retention)})
	}
	return out
}

// DropExpired drops every period that is wholly older than now
// minus its level's retention, and returns what it dropped.
func (s *Set) DropExpired(ctx context.Context, now time.Time) ([]Period, error) {
	var dropped []Period
	for _, p := range s.Periods() {
		if now.Before(p.Expires) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return dropped, err
		}
		lvl := slices.IndexFunc(s.levels, func(l Level) bool { return l == p.Level })
		if err := s.drop(periodKey{level: lvl, month: monthOf(buckets.MustTicks(p.Month))}); err != nil {
			return dropped, err
		}
		dropped = append(dropped, p)
	}
	return dropped, nil
}

// drop removes the period of k: it is forgotten at once, and its
// directory removed once its users let go.
func (s *Set) drop(k periodKey) error {
	s.mu.Lock()
	p := s.periods[k]
	delete(s.periods, k)
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	p.rw.Lock()
	defer p.rw.Unlock()
	if err := s.closeDB(p); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(p.dir), dropPrefix+filepath.Base(p.dir))
	if err := os.Rename(p.dir, tmp); err != nil {
		return fmt.Errorf("drop rollup %s: %w", p.dir, err)
	}
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("drop rollup %s: %w", p.dir, err)
	}
	return nil
}

// Close closes every open period database, waiting for their users.
func (s *Set) Close() error {
	s.mu.Lock()
	s.closed = true
	ps := make([]*period, 0, len(s.periods))
	for _, p := range s.periods {
		ps = append(ps, p)
	}
	s.mu.Unlock()
	var errs []error
	for _, p := range ps {
		p.rw.Lock()
		errs = append(errs, s.closeDB(p))
		p.rw.Unlock()
	}
	s.sweeps.Wait()
	return errors.Join(errs...)
}

// Span is the time the period databases cover, from the start of the
// oldest to the end of the newest; ok is false when there are none.
func (s *Set) Span() (lo, hi buckets.Ticks, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.periods {
		plo, phi := monthStart(k.month), monthStart(k.month+s.levels[k.level].months())
		if !ok || plo < lo {
			lo = plo
		}
		if !ok || phi > hi {
			hi = phi
		}
		ok = true
	}
	return lo, hi, ok
}

// DeleteDevice removes every bucket and mark of dev, in every period
// database on disk, and returns how many keys it removed.
func (s *Set) DeleteDevice(ctx context.Context, dev buckets.DeviceID) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	keys := make([]periodKey, 0, len(s.periods))
	for k := range s.periods {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		p, done, err := s.use(k, false)
		if err != nil {
			return n, err
		}
		if p == nil {
			continue
		}
		m, err := deleteDevice(p.db.Load(), dev)
		done()
		n += m
		if err != nil {
			return n, fmt.Errorf("rollup %s: delete %s: %w", p.dir, dev, err)
		}
	}
	return n, nil
}

// deleteDevice deletes the records and marks of dev in db.
func deleteDevice(db *badger.DB, dev buckets.DeviceID) (int, error) {
	var keys [][]byte
	err := db.View(func(txn *badger.Txn) error {
		for _, prefix := range [][]byte{append([]byte(dev), '/'), append(append([]byte("\x00mark/"), dev...), '/')} {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
			for it.Rewind(); it.Valid(); it.Next() {
				keys = append(keys, it.Item().KeyCopy(nil))
			}
			it.Close()
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if len(keys) == 0 {
		return 0, nil
	}
	wb := db.NewWriteBatch()
	defer wb.Cancel()
	for _, k := range keys {
		if err := wb.Delete(k); err != nil {
			return 0, err
		}
	}
	if err := wb.Flush(); err != nil {
		return 0, err
	}
	return len(keys), db.Update(func(txn *badger.Txn) error { return txn.Set(commitKey, nil) })
}

// commitKey is written, empty, after a device's deletions. Badger
// numbers the commits of a period database from the newest version it
// holds when it opens; once compaction dropped the deletions with the
// records they deleted, their versions would be given out again, to
// commits an incremental backup taken after the deletions (copying the
// entries above their version) would never copy. The key keeps the
// newest version at or above them.
var commitKey = []byte("\x00meta/commit")

// PeriodName is the name of a period database relative to the rollups
// directory: "<level>/YYYY-MM".
func PeriodName(p Period) string { return p.Level.Name() + "/" + p.Month.Format(monthLayout) }

// ParsePeriodName checks a name PeriodName made (a level's interval and
// a month) and returns its two parts.
func ParsePeriodName(name string) (level, month string, err error) {
	level, month, ok := strings.Cut(name, "/")
	if !ok {
		return "", "", fmt.Errorf("rollup period %q is not <level>/YYYY-MM", name)
	}
	if d, err := ParseDuration(level); err != nil || FormatDuration(d) != level {
		return "", "", fmt.Errorf("rollup period %q: level %q is not an interval", name, level)
	}
	if t, err := time.Parse(monthLayout, month); err != nil || t.Format(monthLayout) != month {
		return "", "", fmt.Errorf("rollup period %q: %q is not a month (YYYY-MM)", name, month)
	}
	return level, month, nil
}

// View calls fn with the database of p, open and held: it is neither
// closed nor dropped until fn returns, while writes go on. It returns
// false without calling fn when p is not on disk (dropped meanwhile).
func (s *Set) View(p Period, fn func(dir string, db *badger.DB) error) (bool, error) {
	lvl := slices.IndexFunc(s.levels, func(l Level) bool { return l == p.Level })
	if lvl < 0 {
		return false, nil
	}
	q, done, err := s.use(periodKey{level: lvl, month: monthOf(buckets.MustTicks(p.Month))}, false)
	if err != nil || q == nil {
		return false, err
	}
	defer done()
	return true, fn(q.dir, q.db.Load())
}
