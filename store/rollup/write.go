package rollup

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/aggregate"
)

// Writer puts a store's rollups as its compactor leaves windows (hours)
// of a device without an open block: it keeps the marks of the hot days
// in memory and counts what it wrote and what failed.
type Writer struct {
	set *Set // nil until SetOpened
	// hot reports whether a day is one of the store's hot days, whose
	// marks are kept in memory.
	hot func(buckets.Day) bool
	// beforePut, when not nil, runs just before each put (for tests).
	beforePut func()
	// marks caches, per day and device, the lowest mark of the levels
	// (-1: none), for the hot days.
	mu    sync.Mutex
	marks map[buckets.Day]map[buckets.DeviceID]buckets.Ticks

	written metric.Int64Counter // telemetry.store.rollup.buckets
	failed  metric.Int64Counter // telemetry.store.rollup.failures
}

// NewWriter returns a writer with its counters made by meter and
// exported from the start; hot says which days' marks to keep in
// memory and beforePut, when not nil, runs before each put. It writes
// once SetOpened gave it the rollups.
func NewWriter(meter metric.Meter, hot func(buckets.Day) bool, beforePut func()) (*Writer, error) {
	w := &Writer{hot: hot, beforePut: beforePut, marks: make(map[buckets.Day]map[buckets.DeviceID]buckets.Ticks)}
	var err error
	if w.written, err = meter.Int64Counter("telemetry.store.rollup.buckets",
		metric.WithDescription("Rollup buckets written (each level counts its own)."),
		metric.WithUnit("{bucket}")); err != nil {
		return nil, fmt.Errorf("rollup buckets counter: %w", err)
	}
	if w.failed, err = meter.Int64Counter("telemetry.store.rollup.failures",
		metric.WithDescription("Rollup writes that failed after a compaction; the next compaction of the device writes those windows again."),
		metric.WithUnit("{failure}")); err != nil {
		return nil, fmt.Errorf("rollup failures counter: %w", err)
	}
	w.written.Add(context.Background(), 0)
	w.failed.Add(context.Background(), 0)
	return w, nil
}

// SetOpened gives the writer the rollups once they are open.
func (w *Writer) SetOpened(set *Set) { w.set = set }

// Failed counts a rollup write that failed.
func (w *Writer) Failed(ctx context.Context) { w.failed.Add(ctx, 1) }

// Mark returns the lowest mark of the levels for dev and day.
func (w *Writer) Mark(dev buckets.DeviceID, day buckets.Day) (buckets.Ticks, error) {
	w.mu.Lock()
	m, ok := w.marks[day][dev]
	w.mu.Unlock()
	if ok {
		return m, nil
	}
	m = buckets.MaxTicks
	for i := range w.set.Levels() {
		lm, err := w.set.Mark(i, dev, day)
		if err != nil {
			return -1, err
		}
		m = min(m, lm)
	}
	w.CacheMark(dev, day, m)
	return m, nil
}

// CacheMark remembers m as the mark of dev and day when day is hot,
// forgetting the marks of days that are not.
func (w *Writer) CacheMark(dev buckets.DeviceID, day buckets.Day, m buckets.Ticks) {
	if !w.hot(day) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	dm := w.marks[day]
	if dm == nil {
		for d := range w.marks {
			if !w.hot(d) {
				delete(w.marks, d)
			}
		}
		dm = make(map[buckets.DeviceID]buckets.Ticks)
		w.marks[day] = dm
	}
	dm[dev] = m
}

// ForgetDevice forgets the marks of dev (for a device delete).
func (w *Writer) ForgetDevice(dev buckets.DeviceID) {
	w.mu.Lock()
	for _, dm := range w.marks {
		delete(dm, dev)
	}
	w.mu.Unlock()
}

// Table is a device's day table as the writer reads buckets from it.
type Table interface {
	// Buckets is the device's buckets of interval in [lo, hi), as an
	// aggregate query of that interval answers them.
	Buckets(ctx context.Context, interval, lo, hi buckets.Ticks) ([]Bucket, error)
}

// Hand is what a compaction just wrote for a device, which answers the
// windows it covers without reading the table again.
type Hand interface {
	// Covers reports whether every block of the device in [lo, hi) is
	// one the compaction wrote.
	Covers(lo, hi buckets.Ticks) bool
	// Buckets is the device's buckets of interval in [lo, hi), which
	// Covers says it holds.
	Buckets(interval, lo, hi buckets.Ticks) ([]Bucket, error)
}

// Put computes dev's buckets of every level in [lo, hi) (whole windows
// of day) and puts them, window by window (so that a transaction stays
// small), raising the marks as it goes and to mark at the end. The
// windows that hand covers are computed from it, the others from t. A
// window without readings is left alone: compactions never take every
// reading out of a window that had some.
func (w *Writer) Put(ctx context.Context, t Table, dev buckets.DeviceID, day buckets.Day, lo, hi, mark buckets.Ticks, hand Hand) error {
	for i, l := range w.set.Levels() {
		bs, err := levelBuckets(ctx, t, buckets.Ticks(l.Interval/100), lo, hi, hand)
		if err != nil {
			return err
		}
		put := buckets.Ticks(-1) // the mark the last put left
		for len(bs) > 0 {
			win := WindowStart(bs[0].Start)
			n, _ := slices.BinarySearchFunc(bs, win+windowTicks, func(b Bucket, k buckets.Ticks) int { return cmp.Compare(b.Start, k) })
			put = mark
			if win+windowTicks < hi {
				put = min(mark, win+windowTicks)
			}
			if w.beforePut != nil {
				w.beforePut()
			}
			if err := w.set.Put(ctx, i, dev, win, win+windowTicks, bs[:n], put); err != nil {
				return err
			}
			w.written.Add(ctx, int64(n))
			bs = bs[n:]
		}
		if put < mark {
			if err := w.set.RaiseMark(ctx, i, dev, day, mark); err != nil {
				return err
			}
		}
	}
	return nil
}

// levelBuckets is the buckets of interval in [lo, hi), from hand for
// the windows it covers and from t for runs of the others.
func levelBuckets(ctx context.Context, t Table, interval, lo, hi buckets.Ticks, hand Hand) ([]Bucket, error) {
	var out []Bucket
	from := lo // start of the run of windows read from t
	for win := lo; win <= hi; win += windowTicks {
		if win < hi && (hand == nil || !hand.Covers(win, win+windowTicks)) {
			continue
		}
		if from < win {
			bs, err := t.Buckets(ctx, interval, from, win)
			if err != nil {
				return nil, err
			}
			out = append(out, bs...)
		}
		from = win + windowTicks
		if win < hi {
			bs, err := hand.Buckets(interval, win, win+windowTicks)
			if err != nil {
				return nil, err
			}
			out = append(out, bs...)
		}
	}
	return out, nil
}

// PageOf is the buckets a holds as rollup buckets.
func PageOf(a *aggregate.Aggregator, interval buckets.Ticks) []Bucket {
	page := a.Page()
	out := make([]Bucket, 0, len(page.Buckets))
	for _, b := range page.Buckets {
		out = append(out, Bucket{Start: b.Start, Values: b.Values, DistinctMs: a.DistinctMs(b.Start, b.Start+interval)})
	}
	return out
}
