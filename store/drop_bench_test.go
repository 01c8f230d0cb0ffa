package store

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/badgeropts"
	"github.com/telemetryd/telemetryd/store/devindex"
	"github.com/telemetryd/telemetryd/store/diskuse"
)

// Parameters of BenchmarkDropDay.
const (
	dropAge        = 30                      // the dropped day is this many days before today
	todayPrefill   = 10_000                  // readings in today's table before the writer starts
	fillBatch      = buckets.MaxBatch        // readings per Write or WriteBatch chunk while filling
	writerBatch    = 100                     // readings per commit of the concurrent writer
	writerPeriod   = 5 * time.Millisecond    // one writer commit per period (20,000 readings/s)
	writerRetry    = 100 * time.Microsecond  // pause before retrying a rejected commit
	baselineWrites = time.Second             // writer runs this long before the drop
	tailWrites     = 200 * time.Millisecond  // and this long after it
	blockedFactor  = 10                      // a commit slower than 10x the baseline median was blocked
	compactionWait = 1500 * time.Millisecond // table-compacting waits this long at most for a compaction to start
)

// dropTarget is one way of keeping two days of readings: the old day
// to drop and today, which a writer keeps writing during the drop.
type dropTarget interface {
	// writeToday commits rs (readings of today) in one transaction.
	writeToday(ctx context.Context, rs []buckets.Reading) error
	// beforeDrop runs right before the drop, untimed.
	beforeDrop(ctx context.Context) error
	// drop deletes every reading of the old day.
	drop(ctx context.Context) error
	// settle lets the database reclaim space (flush, compaction) and
	// leaves it closed. It is not timed.
	settle(ctx context.Context) error
	close() error
}

// dropMethod builds a dropTarget in dir holding n readings of the old
// day and todayPrefill readings of today, flushed to disk and reopened.
type dropMethod struct {
	name  string
	setup func(ctx context.Context, dir string, n int) (dropTarget, error)
}

var dropMethods = []dropMethod{
	{"table", setupTableDrop(untouched)},
	{"table-compacting", setupTableDrop(listed)},
	{"table-queried", setupTableDrop(queried)},
	{"keys", setupSharedDB(deleteKeys)},
	{"prefix", setupSharedDB(func(_ context.Context, db *badger.DB, prefix []byte) error { return db.DropPrefix(prefix) })},
}

// BenchmarkDropDay measures ways to delete one UTC day of readings
// (1000 devices, 3 float values each), on the same data, while a writer
// commits writerBatch readings of today every writerPeriod:
//
//   - table: Store.DropTable of the day's own Badger database, closed
//     as a day table 30 days old is in a running service;
//   - table-compacting: the same table right after Store.Tables listed
//     it, as the first retention run after a restart does, dropped once
//     a compaction of it is writing, if one starts. Tables used to open
//     every table whose count it did not know yet, which started a
//     compaction the drop then waited for; it now opens none;
//   - table-queried: the same after a query read the old day, which
//     opens its table (cold tables open read-only for reads: no
//     compaction starts);
//   - keys: one shared Badger database (hot-table options) with a day
//     prefix in front of every key, deleting the day's keys one by one
//     (a key-only scan feeding a WriteBatch of deletes);
//   - prefix: the same shared database, badger DB.DropPrefix.
//
// ns/op and drop-s are the drop alone (filling is untimed; allocations
// include the writer's). The writer's commits that overlap the drop
// give write-p99-ms, write-max-ms and blocked-ms (the sum of those
// slower than blockedFactor x write-median-ms, the median before the
// drop); rejected-commits counts attempts refused (ErrBlockedWrites)
// and retried. freed-MiB is the drop in du of the data directory right
// after the drop; freed-compacted-MiB after the store is closed or the
// shared database is compacted into one level. Both include what the
// writer added meanwhile. Metrics are means over iterations.
//
// Each iteration fills up to a million readings, so it runs only with
// a fixed iteration count:
//
//	go test ./store -run XXX -bench BenchmarkDropDay -benchtime 1x -timeout 30m
func BenchmarkDropDay(b *testing.B) {
	if f := flag.Lookup("test.benchtime"); f == nil || !strings.HasSuffix(f.Value.String(), "x") {
		b.Skip("each iteration fills up to 1M readings: run with -benchtime 1x")
	}
	for _, n := range []int{100_000, 1_000_000} {
		for _, m := range dropMethods {
			b.Run(fmt.Sprintf("%s/readings=%d", m.name, n), func(b *testing.B) {
				b.ReportAllocs()
				b.StopTimer()
				var sum dropResult
				for range b.N {
					r := runDrop(b, m, n)
					sum.add(r)
				}
				sum.report(b)
			})
		}
	}
}

// dropResult is what one drop measured.
type dropResult struct {
	drop           time.Duration
	bytesBefore    int64 // du of the data directory before the drop
	freed          int64 // du before minus du right after the drop
	freedCompacted int64 // du before minus du after compaction
	writes         writeStats
	iterations     int
}

func (r *dropResult) add(o dropResult) {
	r.drop += o.drop
	r.bytesBefore += o.bytesBefore
	r.freed += o.freed
	r.freedCompacted += o.freedCompacted
	r.writes.add(o.writes)
	r.iterations++
}

func (r *dropResult) report(b *testing.B) {
	n := float64(r.iterations)
	mb := func(v int64) float64 { return float64(v) / n / (1 << 20) }
	ms := func(d time.Duration) float64 { return float64(d) / n / float64(time.Millisecond) }
	b.ReportMetric(r.drop.Seconds()/n, "drop-s")
	b.ReportMetric(mb(r.bytesBefore), "before-MiB")
	b.ReportMetric(mb(r.freed), "freed-MiB")
	b.ReportMetric(mb(r.freedCompacted), "freed-compacted-MiB")
	b.ReportMetric(ms(r.writes.median), "write-median-ms")
	b.ReportMetric(ms(r.writes.p99), "write-p99-ms")
	b.ReportMetric(ms(r.writes.max), "write-max-ms")
	b.ReportMetric(ms(r.writes.blocked), "blocked-ms")
	b.ReportMetric(float64(r.writes.during)/n, "writes-in-drop")
	b.ReportMetric(float64(r.writes.rejected)/n, "rejected-commits")
}

// runDrop fills a fresh target, starts the writer, times the drop and
// measures the disk before, right after, and after compaction.
func runDrop(b *testing.B, m dropMethod, n int) dropResult {
	ctx := context.Background()
	dir := b.TempDir()
	target, err := m.setup(ctx, dir, n)
	if err != nil {
		b.Fatalf("fill %s: %v", m.name, err)
	}
	defer func() {
		if err := target.close(); err != nil {
			b.Errorf("close %s: %v", m.name, err)
		}
	}()
	w := startWriter(ctx, target)
	time.Sleep(baselineWrites)
	if err := target.beforeDrop(ctx); err != nil {
		w.stop()
		b.Fatalf("before drop %s: %v", m.name, err)
	}
	before := diskuse.Tree(dir)

	start := time.Now()
	b.StartTimer()
	err = target.drop(ctx)
	b.StopTimer()
	end := time.Now()
	if err != nil {
		w.stop()
		b.Fatalf("drop %s: %v", m.name, err)
	}
	after := diskuse.Tree(dir)
	time.Sleep(tailWrites)
	commits, failures := w.stop()
	for _, err := range failures {
		b.Errorf("write today: %v", err)
	}
	if err := target.settle(ctx); err != nil {
		b.Fatalf("settle %s: %v", m.name, err)
	}
	return dropResult{
		drop:           end.Sub(start),
		bytesBefore:    before,
		freed:          before - after,
		freedCompacted: before - diskuse.Tree(dir),
		writes:         summarize(commits, start, end),
	}
}

// tableUse is what happens to the old table after the restart, before
// it is dropped.
type tableUse int

const (
	untouched tableUse = iota // nothing: it stays closed
	listed                    // Store.Tables lists it
	queried                   // Store.Get reads a reading of it
)

// tableTarget is a Store with the old day in its own table.
type tableTarget struct {
	s   *Store
	old buckets.Day
	use tableUse
}

// setupTableDrop returns a setup that fills a store (the clock on the
// old day, so its table is written hot, as it was on that day) and
// reopens it with the clock on today. beforeDrop then uses the old
// table as use says.
func setupTableDrop(use tableUse) func(context.Context, string, int) (dropTarget, error) {
	return func(ctx context.Context, dir string, n int) (dropTarget, error) {
		clock := &testClock{}
		opts := DefaultOptions()
		opts.Logger = quietLogger()
		opts.Now = clock.Now
		old := today - dropAge
		clock.set(old.Start().Time().Add(12 * time.Hour))
		s, err := Open(ctx, dir, opts)
		if err != nil {
			return nil, err
		}
		err = errors.Join(
			fillDay(old.Start(), buckets.TicksPerDay, n, func(rs []buckets.Reading) error { return s.Write(ctx, rs) }),
			fillDay(today.Start(), buckets.TicksPerDay/2, todayPrefill, func(rs []buckets.Reading) error { return s.Write(ctx, rs) }),
			s.Close())
		if err != nil {
			return nil, err
		}
		clock.set(baseTime)
		if s, err = Open(ctx, dir, opts); err != nil {
			return nil, err
		}
		return &tableTarget{s: s, old: old, use: use}, nil
	}
}

func (t *tableTarget) writeToday(ctx context.Context, rs []buckets.Reading) error {
	return t.s.Write(ctx, rs)
}

// beforeDrop lists the tables or reads a reading of the old day, as
// t.use says, and then waits up to compactionWait for a compaction of
// the old table to start writing, seen as a new SSTable file. Badger
// starts compactions after a random delay of up to a second; when none
// starts (the table is not open, or open read-only, or its level 0
// needs no compaction) it is dropped after compactionWait.
func (t *tableTarget) beforeDrop(ctx context.Context) error {
	if t.use == untouched {
		return nil
	}
	pattern := filepath.Join(t.s.tableDir(t.old), "*.sst")
	ssts, err := filepath.Glob(pattern)
	if err != nil {
		return err
	}
	if t.use == listed {
		_, err = t.s.Tables(ctx)
	} else {
		_, err = t.s.Get(ctx, benchDevices[0], t.old.Start())
	}
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(compactionWait); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		now, err := filepath.Glob(pattern)
		if err != nil {
			return err
		}
		for _, f := range now {
			if !slices.Contains(ssts, f) {
				return nil
			}
		}
	}
	return nil
}

func (t *tableTarget) drop(ctx context.Context) error {
	_, err := t.s.DropTable(ctx, t.old)
	return err
}

// settle closes the store, which flushes today's memtables to disk
// (the old day's files are gone already).
func (t *tableTarget) settle(context.Context) error { return t.s.Close() }

// close is idempotent: Store.Close is.
func (t *tableTarget) close() error { return t.s.Close() }

// sharedTarget is one Badger database for every day, keys prefixed
// with "YYYY-MM-DD/".
type sharedTarget struct {
	dir      string
	db       *badger.DB
	old, now []byte // day prefixes
	dropFn   func(ctx context.Context, db *badger.DB, prefix []byte) error
}

// openShared opens a shared database with the options of a hot day
// table. With compactL0OnClose (used only outside the timed part),
// Close also compacts level 0, which Flatten leaves alone when it is
// the only level with data.
func openShared(dir string, compactL0OnClose bool) (*badger.DB, error) {
	return badger.Open(badgeropts.For(dir, badgeropts.Hot, false, false, quietLogger()).WithCompactL0OnClose(compactL0OnClose))
}

// compactShared compacts the whole tree of the closed database in dir
// into one level, as compaction would have over the days since the old
// day was written, and leaves it closed.
func compactShared(dir string) error {
	db, err := openShared(dir, true)
	if err != nil {
		return err
	}
	return errors.Join(db.Flatten(2), db.Close())
}

// setupSharedDB fills a shared database through WriteBatch, compacts
// it and reopens it.
func setupSharedDB(dropFn func(context.Context, *badger.DB, []byte) error) func(context.Context, string, int) (dropTarget, error) {
	return func(ctx context.Context, dir string, n int) (dropTarget, error) {
		old := today - dropAge
		t := &sharedTarget{dir: dir, old: dayPrefix(old), now: dayPrefix(today), dropFn: dropFn}
		db, err := openShared(dir, false)
		if err != nil {
			return nil, err
		}
		err = errors.Join(
			fillDay(old.Start(), buckets.TicksPerDay, n, func(rs []buckets.Reading) error { return setBatch(db, t.old, rs) }),
			fillDay(today.Start(), buckets.TicksPerDay/2, todayPrefill, func(rs []buckets.Reading) error { return setBatch(db, t.now, rs) }),
			db.Close())
		if err != nil {
			return nil, err
		}
		if err := compactShared(dir); err != nil {
			return nil, err
		}
		if t.db, err = openShared(dir, false); err != nil {
			return nil, err
		}
		return t, nil
	}
}

func dayPrefix(d buckets.Day) []byte { return []byte(d.String() + "/") }

// sharedKey is prefix + the per-reading key of r.
func sharedKey(prefix []byte, r *buckets.Reading) []byte {
	return appendReadingKey(append(make([]byte, 0, len(prefix)+len(r.Device)+9), prefix...), r.Device, r.Ticks)
}

// appendReadingKey appends the key of one reading in the per-reading
// layout the benchmarks compare blocks with:
// <device> '/' <inverted ticks, 8 bytes big-endian>.
func appendReadingKey(dst []byte, device buckets.DeviceID, k buckets.Ticks) []byte {
	dst = append(append(dst, device...), '/')
	return binary.BigEndian.AppendUint64(dst, k.Inverted())
}

// setBatch writes rs under prefix with a WriteBatch.
func setBatch(db *badger.DB, prefix []byte, rs []buckets.Reading) error {
	wb := db.NewWriteBatch()
	defer wb.Cancel()
	for i := range rs {
		if err := wb.Set(sharedKey(prefix, &rs[i]), devindex.AppendValues(nil, rs[i].Values)); err != nil {
			return err
		}
	}
	return wb.Flush()
}

// writeToday commits rs in one transaction, like a day table's writer.
func (t *sharedTarget) writeToday(_ context.Context, rs []buckets.Reading) error {
	txn := t.db.NewTransaction(true)
	defer txn.Discard()
	for i := range rs {
		if err := txn.Set(sharedKey(t.now, &rs[i]), devindex.AppendValues(nil, rs[i].Values)); err != nil {
			return err
		}
	}
	return txn.Commit()
}

func (t *sharedTarget) beforeDrop(context.Context) error { return nil }

func (t *sharedTarget) drop(ctx context.Context) error { return t.dropFn(ctx, t.db, t.old) }

// settle closes the database and compacts it into one level, which
// drops deleted keys and their tombstones. It stays closed.
func (t *sharedTarget) settle(context.Context) error {
	err := t.db.Close()
	t.db = nil
	if err != nil {
		return err
	}
	return compactShared(t.dir)
}

func (t *sharedTarget) close() error {
	if t.db == nil {
		return nil
	}
	return t.db.Close()
}

// deleteKeys deletes every key under prefix one by one: a key-only
// scan of a snapshot feeding a WriteBatch of deletes.
func deleteKeys(ctx context.Context, db *badger.DB, prefix []byte) error {
	wb := db.NewWriteBatch()
	defer wb.Cancel()
	err := db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = prefix
		opts.PrefetchValues = false
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := wb.Delete(it.Item().KeyCopy(nil)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return wb.Flush()
}

// fillDay emits n readings spread evenly over [from, from+span), one
// per device per instant, with three float values, in chunks of
// fillBatch in ascending time.
func fillDay(from, span buckets.Ticks, n int, emit func([]buckets.Reading) error) error {
	instants := n / len(benchDevices)
	step := span / buckets.Ticks(instants)
	batch := make([]buckets.Reading, 0, fillBatch)
	for i := range instants {
		k := from + buckets.Ticks(i)*step
		for j, dev := range benchDevices {
			batch = append(batch, benchReading(dev, k+buckets.Ticks(j), i+j))
		}
		if len(batch)+len(benchDevices) > fillBatch || i == instants-1 {
			if err := emit(batch); err != nil {
				return err
			}
			batch = make([]buckets.Reading, 0, fillBatch)
		}
	}
	return nil
}

// benchReading is a reading of dev at k with three float values.
func benchReading(dev buckets.DeviceID, k buckets.Ticks, seed int) buckets.Reading {
	return buckets.Reading{Device: dev, Ticks: k, Values: []buckets.Field{
		{Name: "hum", Value: buckets.Float(35 + float64(seed%617)/13)},
		{Name: "pressure", Value: buckets.Float(990 + float64(seed%389)/7)},
		{Name: "temp", Value: buckets.Float(18 + float64(seed%1000)/37)},
	}}
}

// commit is one commit of the writer.
type commit struct {
	start, end time.Time
	rejected   int // attempts rejected as unavailable (blocked writes) before it succeeded
}

// todayWriter commits writerBatch readings of today every writerPeriod
// until stopped, retrying commits that the database rejects as
// temporarily unavailable, and records how long each commit took.
type todayWriter struct {
	cancel   context.CancelFunc
	done     chan struct{}
	commits  []commit
	failures []error
}

func startWriter(ctx context.Context, target dropTarget) *todayWriter {
	ctx, cancel := context.WithCancel(ctx)
	w := &todayWriter{cancel: cancel, done: make(chan struct{})}
	go w.run(ctx, target)
	return w
}

// stop stops the writer, waits for it and returns what it recorded.
func (w *todayWriter) stop() ([]commit, []error) {
	w.cancel()
	<-w.done
	return w.commits, w.failures
}

func (w *todayWriter) run(ctx context.Context, target dropTarget) {
	defer close(w.done)
	first := baseTime.Add(time.Minute) // after today's prefill
	for i := 0; ctx.Err() == nil; i++ {
		rs := make([]buckets.Reading, writerBatch)
		for j := range rs {
			n := i*writerBatch + j
			rs[j] = benchReading(benchDevices[n%len(benchDevices)], buckets.MustTicks(first)+buckets.Ticks(n)*1000, n)
		}
		c := commit{start: time.Now()}
		for {
			err := target.writeToday(ctx, rs)
			if err == nil {
				break
			}
			if !errors.Is(err, badger.ErrBlockedWrites) && !errors.Is(err, buckets.ErrUnavailable) {
				w.failures = append(w.failures, err)
				break
			}
			c.rejected++
			time.Sleep(writerRetry)
		}
		c.end = time.Now()
		w.commits = append(w.commits, c)
		if pause := writerPeriod - c.end.Sub(c.start); pause > 0 {
			time.Sleep(pause)
		}
	}
}

// writeStats summarizes the writer's commits around a drop.
type writeStats struct {
	median   time.Duration // median commit latency before the drop
	p99, max time.Duration // of the commits that overlapped the drop
	blocked  time.Duration // total latency of those slower than blockedFactor x median
	during   int           // commits that overlapped the drop
	rejected int           // rejected attempts during the drop
}

func (s *writeStats) add(o writeStats) {
	s.median += o.median
	s.p99 += o.p99
	s.max += o.max
	s.blocked += o.blocked
	s.during += o.during
	s.rejected += o.rejected
}

// summarize computes writeStats for a drop that ran from start to end.
func summarize(commits []commit, start, end time.Time) writeStats {
	var base, during []time.Duration
	var s writeStats
	for _, c := range commits {
		lat := c.end.Sub(c.start)
		switch {
		case c.end.Before(start):
			base = append(base, lat)
		case !c.start.After(end):
			during = append(during, lat)
			s.rejected += c.rejected
		}
	}
	s.median = percentile(base, 0.5)
	s.p99 = percentile(during, 0.99)
	s.max = percentile(during, 1)
	s.during = len(during)
	for _, d := range during {
		if d > blockedFactor*s.median {
			s.blocked += d
		}
	}
	return s
}

// percentile is the q-quantile (nearest rank) of ds, 0 for none.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	i := int(q*float64(len(ds))+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}
