package store

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"

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
	set *rollup.Set    // nil: rollups are off
	w   *rollup.Writer // puts them after compactions
}

// openRollups makes the rollup counters and opens the rollups when
// Options.Rollups asks for them.
func (s *Store) openRollups() error {
	w, err := rollup.NewWriter(s.opts.MeterProvider.Meter(instrumentationName), s.isHot, func() {
		if testHookTableWrite != nil {
			testHookTableWrite("rollup")
		}
	})
	if err != nil {
		return err
	}
	r := &rollState{w: w}
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
	w.SetOpened(set)
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
	var hand rollup.Hand // nil: none
	if len(entries) > 0 {
		hand = newInHand(dev, c.refs, c.take, entries, c.merged, c.sealed)
	}
	mark := s.newMark(t, c.after, c.full)
	old, err := s.rollups.w.Mark(dev, t.day)
	if err != nil {
		s.rollups.w.Failed(context.Background())
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
		if err := s.rollups.w.Put(ctx, rollSource{t, dev}, dev, t.day, w, w+sealWindow, old, hand); err != nil {
			s.rollups.w.Failed(ctx)
			s.log.Error("write rollups", "device", string(dev), "window", w.FormatTime(), "err", err)
			return
		}
	}
	if mark > old {
		if err := s.rollups.w.Put(ctx, rollSource{t, dev}, dev, t.day, old, mark, mark, hand); err != nil {
			s.rollups.w.Failed(ctx)
			s.log.Error("write rollups", "device", string(dev), "from", old.FormatTime(), "to", mark.FormatTime(), "err", err)
			return
		}
		s.rollups.w.CacheMark(dev, t.day, mark)
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

// rollSource is dev's day table t as the rollup writer reads it.
type rollSource struct {
	t   *table
	dev buckets.DeviceID
}

// Buckets is dev's buckets of interval in [lo, hi) of t, as an
// aggregate query of that interval answers them.
func (rs rollSource) Buckets(ctx context.Context, interval, lo, hi buckets.Ticks) ([]rollup.Bucket, error) {
	t, dev := rs.t, rs.dev
	a := aggregate.New(buckets.AggregateQuery{Device: dev, From: lo, To: hi, Interval: interval, Limit: int(sealWindow * 24 / buckets.TicksPerSecond)}, 0)
	if _, err := aggregateTable(ctx, a, t, lo, hi); err != nil {
		return nil, fmt.Errorf("rollup of %s in %s: %w", dev, t.day, err)
	}
	return rollup.PageOf(a, interval), nil
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
	old, err := s.rollups.w.Mark(dev, t.day)
	if err != nil || old >= t.day.End() {
		return err
	}
	return s.guard(t, func() error {
		return s.rollups.w.Put(ctx, rollSource{t, dev}, dev, t.day, max(old, t.day.Start()), t.day.End(), t.day.End(), nil)
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
	s.rollups.w.ForgetDevice(dev)
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
