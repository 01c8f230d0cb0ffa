package store

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/aggregate"
	"github.com/telemetryd/telemetryd/store/badgeropts"
	"github.com/telemetryd/telemetryd/store/rollup"
)

// Rollups (Options.Rollups) are written by the compactor: once a
// compaction leaves a device with no open block in a window (an hour),
// the buckets of every level in that window are computed from the
// window's blocks with the aggregator, exactly as an aggregate query of
// that interval would compute them from the day table, and put in the
// level's rollup database. Per device and day each level keeps a mark:
// every window before it was put as the day table held it. A late
// reading in a window before the mark is merged by the next compaction
// (its block is urgent), which puts that window again. Before a day
// table is dropped, the windows of each device past its mark (the last
// hour of the day stays open until then) are put from the table, so a
// rollup holds every reading the day table held.

// rollupsDirName is the directory of the rollups under the data dir.
const rollupsDirName = "rollups"

// rollState is the store's side of its rollups.
type rollState struct {
	set *rollup.Set // nil: rollups are off
	// marks caches, per day and device, the lowest mark of the levels
	// (-1: none), for the hot days.
	mu    sync.Mutex
	marks map[buckets.Day]map[buckets.DeviceID]buckets.Ticks

	written metric.Int64Counter // telemetry.store.rollup.buckets
	failed  metric.Int64Counter // telemetry.store.rollup.failures
}

// newRollupMetrics creates the rollup counters, exported from the start.
func (r *rollState) newMetrics(mp metric.MeterProvider) error {
	meter := mp.Meter(instrumentationName)
	var err error
	if r.written, err = meter.Int64Counter("telemetry.store.rollup.buckets",
		metric.WithDescription("Rollup buckets written (each level counts its own)."),
		metric.WithUnit("{bucket}")); err != nil {
		return fmt.Errorf("rollup buckets counter: %w", err)
	}
	if r.failed, err = meter.Int64Counter("telemetry.store.rollup.failures",
		metric.WithDescription("Rollup writes that failed after a compaction; the next compaction of the device writes those windows again."),
		metric.WithUnit("{failure}")); err != nil {
		return fmt.Errorf("rollup failures counter: %w", err)
	}
	r.written.Add(context.Background(), 0)
	r.failed.Add(context.Background(), 0)
	return nil
}

// openRollups makes the rollup counters and opens the rollups when
// Options.Rollups asks for them.
func (s *Store) openRollups() error {
	r := &rollState{marks: make(map[buckets.Day]map[buckets.DeviceID]buckets.Ticks)}
	if err := r.newMetrics(s.opts.MeterProvider); err != nil {
		return err
	}
	s.rollups = r
	if len(s.opts.Rollups) == 0 || s.opts.ReadOnly {
		return nil
	}
	set, err := rollup.Open(filepath.Join(s.dir, rollupsDirName), rollup.Options{
		Levels: s.opts.Rollups,
		Badger: func(dir string) badger.Options {
			return badgeropts.Rollup(dir, s.opts.SyncWrites, false, s.log)
		},
		Logger: s.log,
	})
	if err != nil {
		return fmt.Errorf("open rollups: %w", err)
	}
	r.set = set
	return nil
}

// rollupsOn reports whether the store keeps rollups.
func (s *Store) rollupsOn() bool { return s.rollups != nil && s.rollups.set != nil }

// closeRollups closes the rollups, if open.
func (s *Store) closeRollups() error {
	if !s.rollupsOn() {
		return nil
	}
	return s.rollups.set.Close()
}

// rollMark returns the lowest mark of the levels for dev and day.
func (s *Store) rollMark(dev buckets.DeviceID, day buckets.Day) (buckets.Ticks, error) {
	r := s.rollups
	r.mu.Lock()
	m, ok := r.marks[day][dev]
	r.mu.Unlock()
	if ok {
		return m, nil
	}
	m = buckets.MaxTicks
	for i := range r.set.Levels() {
		lm, err := r.set.Mark(i, dev, day)
		if err != nil {
			return -1, err
		}
		m = min(m, lm)
	}
	s.cacheMark(dev, day, m)
	return m, nil
}

// cacheMark remembers m as the mark of dev and day when day is hot,
// forgetting the marks of days that are not.
func (s *Store) cacheMark(dev buckets.DeviceID, day buckets.Day, m buckets.Ticks) {
	if !s.isHot(day) {
		return
	}
	r := s.rollups
	r.mu.Lock()
	defer r.mu.Unlock()
	dm := r.marks[day]
	if dm == nil {
		for d := range r.marks {
			if !s.isHot(d) {
				delete(r.marks, d)
			}
		}
		dm = make(map[buckets.DeviceID]buckets.Ticks)
		r.marks[day] = dm
	}
	dm[dev] = m
}

// compacted is what a compaction of a device did, for its rollups:
// after are the device's blocks after it (every open one among them);
// refs, take, entries, merged and sealed are as compactDevice has them
// (entries nil when it merged nothing); full says it was a full one.
type compacted struct {
	after   []keyedRef
	full    bool
	refs    []keyedRef
	take    []keyedRef
	entries []entry
	merged  []buckets.Reading
	sealed  buckets.Ticks
}

// rollCompacted puts the windows of dev that a compaction of t left
// without an open block and that the rollups do not hold yet, or that
// it merged again. A full compaction of a day that is over (the table
// went quiet, or closes) puts the rest of the day: its last window's
// block stays open, but no reading is expected there any more (a late
// one makes the next compaction put its window again). writeMu is
// held. A failure is logged: the mark stays where it was, so the next
// compaction of the device puts those windows again.
func (s *Store) rollCompacted(t *table, dev buckets.DeviceID, c compacted) {
	if !s.rollupsOn() || len(c.after) == 0 {
		return
	}
	entries := c.entries
	var hand *inHand
	if len(entries) > 0 {
		hand = newInHand(dev, c.refs, c.take, entries, c.merged, c.sealed)
	}
	mark := s.newMark(t, c.after, c.full)
	old, err := s.rollMark(dev, t.day)
	if err != nil {
		s.rollups.failed.Add(context.Background(), 1)
		s.log.Error("read rollup mark", "device", string(dev), "day", t.day.String(), "err", err)
		return
	}
	old = max(old, t.day.Start())
	var again []buckets.Ticks // windows before the old mark merged again
	for _, e := range entries {
		for w := windowStart(e.ref.oldest); w <= e.ref.newest && w < old; w += sealWindow {
			again = append(again, w)
		}
	}
	slices.Sort(again)
	again = slices.Compact(again)
	ctx := context.Background()
	for _, w := range again {
		if err := s.putRollups(ctx, t, dev, w, w+sealWindow, old, hand); err != nil {
			s.rollups.failed.Add(ctx, 1)
			s.log.Error("write rollups", "device", string(dev), "window", w.FormatTime(), "err", err)
			return
		}
	}
	if mark > old {
		if err := s.putRollups(ctx, t, dev, old, mark, mark, hand); err != nil {
			s.rollups.failed.Add(ctx, 1)
			s.log.Error("write rollups", "device", string(dev), "from", old.FormatTime(), "to", mark.FormatTime(), "err", err)
			return
		}
		s.cacheMark(dev, t.day, mark)
	}
}

// newMark is the mark of a device of t whose blocks are after (every
// open one among them), after a compaction (full or not): the start of
// the oldest window with an open block, else of its newest window,
// else, after a full compaction of a day that is over, the day's end.
func (s *Store) newMark(t *table, after []keyedRef, full bool) buckets.Ticks {
	if full && !s.now().Before(t.day.End().Time()) {
		return t.day.End()
	}
	mark := buckets.Ticks(-1)
	newest := buckets.Ticks(-1)
	for _, r := range after {
		newest = max(newest, r.newest)
		if !r.sealed && (mark < 0 || windowStart(r.oldest) < mark) {
			mark = windowStart(r.oldest)
		}
	}
	if mark < 0 { // every block sealed; the newest window may go on
		mark = windowStart(newest)
	}
	return min(max(mark, t.day.Start()), t.day.End())
}

// putRollups computes dev's buckets of every level in [lo, hi) (whole
// windows of t's day) and puts them, window by window (so that a
// transaction stays small), raising the marks as it goes and to mark
// at the end. The windows that hand covers are computed from it, the
// others from t. A window without readings is left alone: compactions
// never take every reading out of a window that had some.
func (s *Store) putRollups(ctx context.Context, t *table, dev buckets.DeviceID, lo, hi, mark buckets.Ticks, hand *inHand) error {
	for i, l := range s.rollups.set.Levels() {
		bs, err := levelBuckets(ctx, t, dev, buckets.Ticks(l.Interval/100), lo, hi, hand)
		if err != nil {
			return err
		}
		put := buckets.Ticks(-1) // the mark the last put left
		for len(bs) > 0 {
			w := windowStart(bs[0].Start)
			n, _ := slices.BinarySearchFunc(bs, w+sealWindow, func(b rollup.Bucket, k buckets.Ticks) int { return cmp.Compare(b.Start, k) })
			put = mark
			if w+sealWindow < hi {
				put = min(mark, w+sealWindow)
			}
			if testHookTableWrite != nil {
				testHookTableWrite("rollup")
			}
			if err := s.rollups.set.Put(ctx, i, dev, w, w+sealWindow, bs[:n], put); err != nil {
				return err
			}
			s.rollups.written.Add(ctx, int64(n))
			bs = bs[n:]
		}
		if put < mark {
			if err := s.rollups.set.RaiseMark(ctx, i, dev, t.day, mark); err != nil {
				return err
			}
		}
	}
	return nil
}

// levelBuckets is dev's buckets of interval in [lo, hi), from hand for
// the windows it covers and from t for runs of the others.
func levelBuckets(ctx context.Context, t *table, dev buckets.DeviceID, interval, lo, hi buckets.Ticks, hand *inHand) ([]rollup.Bucket, error) {
	var out []rollup.Bucket
	from := lo // start of the run of windows read from t
	for w := lo; w <= hi; w += sealWindow {
		if w < hi && !hand.covers(w, w+sealWindow) {
			continue
		}
		if from < w {
			bs, err := rollupBuckets(ctx, t, dev, interval, from, w)
			if err != nil {
				return nil, err
			}
			out = append(out, bs...)
		}
		from = w + sealWindow
		if w < hi {
			bs, err := hand.buckets(interval, w, w+sealWindow)
			if err != nil {
				return nil, err
			}
			out = append(out, bs...)
		}
	}
	return out, nil
}

// rollupBuckets is dev's buckets of interval in [lo, hi) of t, as an
// aggregate query of that interval answers them.
func rollupBuckets(ctx context.Context, t *table, dev buckets.DeviceID, interval, lo, hi buckets.Ticks) ([]rollup.Bucket, error) {
	a := aggregate.New(buckets.AggregateQuery{Device: dev, From: lo, To: hi, Interval: interval, Limit: int(sealWindow * 24 / buckets.TicksPerSecond)}, 0)
	if _, err := aggregateTable(ctx, a, t, lo, hi); err != nil {
		return nil, fmt.Errorf("rollup of %s in %s: %w", dev, t.day, err)
	}
	return rollupPage(a, interval), nil
}

// rollupPage is the buckets a holds as rollup buckets.
func rollupPage(a *aggregate.Aggregator, interval buckets.Ticks) []rollup.Bucket {
	page := a.Page()
	out := make([]rollup.Bucket, 0, len(page.Buckets))
	for _, b := range page.Buckets {
		out = append(out, rollup.Bucket{Start: b.Start, Values: b.Values, DistinctMs: a.DistinctMs(b.Start, b.Start+interval)})
	}
	return out
}

// rollBeforeDrop puts, for every device of the table of day, the
// windows past its mark, so that the rollups hold every reading of the
// day before it goes.
func (s *Store) rollBeforeDrop(ctx context.Context, day buckets.Day) error {
	if !s.rollupsOn() {
		return nil
	}
	t, err := s.acquire(ctx, day, forRead)
	if err != nil || t == nil {
		return err
	}
	defer s.release(t)
	var devs []buckets.DeviceID
	err = s.guard(t, func() error {
		devs, err = devicesIn(t, false)
		return err
	})
	if err != nil {
		return fmt.Errorf("roll up table %s: %w", day, err)
	}
	for _, dev := range devs {
		if err := s.rollDevice(ctx, t, dev); err != nil {
			return fmt.Errorf("roll up table %s: %w", day, err)
		}
	}
	return nil
}

// rollDevice puts dev's windows of t past its mark.
func (s *Store) rollDevice(ctx context.Context, t *table, dev buckets.DeviceID) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	old, err := s.rollMark(dev, t.day)
	if err != nil || old >= t.day.End() {
		return err
	}
	return s.guard(t, func() error {
		return s.putRollups(ctx, t, dev, max(old, t.day.Start()), t.day.End(), t.day.End(), nil)
	})
}

// DropExpiredRollups drops the rollup periods (a level's month) whose
// whole month is older than the level's retention at now, and returns
// how many it dropped. With rollups off it does nothing.
func (s *Store) DropExpiredRollups(ctx context.Context, now time.Time) (int, error) {
	if !s.rollupsOn() {
		return 0, nil
	}
	ps, err := s.rollups.set.DropExpired(ctx, now)
	for _, p := range ps {
		s.log.Info("rollup period dropped", "level", p.Level.Name(), "month", p.Month.Format("2006-01"), "bytes", p.SizeBytes)
	}
	if err != nil {
		return len(ps), fmt.Errorf("drop expired rollups: %w", err)
	}
	return len(ps), nil
}

// RollupPeriods lists the rollup periods on disk (none with rollups
// off).
func (s *Store) RollupPeriods() []rollup.Period {
	if !s.rollupsOn() {
		return nil
	}
	return s.rollups.set.Periods()
}

// deleteDeviceRollups removes dev's rollups and marks (for a device
// delete). With rollups off it does nothing.
func (s *Store) deleteDeviceRollups(ctx context.Context, dev buckets.DeviceID) error {
	if !s.rollupsOn() {
		return nil
	}
	s.rollups.mu.Lock()
	for _, dm := range s.rollups.marks {
		delete(dm, dev)
	}
	s.rollups.mu.Unlock()
	if _, err := s.rollups.set.DeleteDevice(ctx, dev); err != nil {
		return fmt.Errorf("delete rollups of %s: %w", dev, err)
	}
	return nil
}

// rollTables is the store's day tables as an aggregate read partly from
// the rollups (rollup.Set.Aggregate) uses them.
type rollTables struct{ s *Store }

var _ rollup.Tables = rollTables{}

// DaySpan is the span of the days that have a table.
func (rt rollTables) DaySpan() (lo, hi buckets.Ticks) {
	lo, hi = buckets.MaxTicks+1, buckets.Ticks(-1)
	rt.s.mu.Lock()
	defer rt.s.mu.Unlock()
	for d := range rt.s.tables {
		lo, hi = min(lo, d.Start()), max(hi, d.End())
	}
	return lo, hi
}

// Has reports whether the table of d exists and is not being dropped.
func (rt rollTables) Has(d buckets.Day) bool {
	rt.s.mu.Lock()
	defer rt.s.mu.Unlock()
	t := rt.s.tables[d]
	return t != nil && !t.dropping
}

// Aggregate adds [lo, hi) of the table of d to agg.
func (rt rollTables) Aggregate(ctx context.Context, agg *aggregate.Aggregator, d buckets.Day, lo, hi buckets.Ticks) (bool, error) {
	return rt.s.aggregateDay(ctx, agg, d, lo, hi)
}

// Classify marks transient storage errors.
func (rollTables) Classify(err error) error { return classify(err) }
