package promapi

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/telemetryd/telemetryd/buckets"
)

// Aggregator is the store's aggregate primitive. When Config.Source
// also implements it, f_over_time(selector[r]) over a range whose
// windows do not overlap is answered from per-window summaries (the
// store reads block headers where it can) instead of every reading.
type Aggregator interface {
	Aggregate(ctx context.Context, q buckets.AggregateQuery) (buckets.AggregatePage, error)
}

// windowFuncs are the functions whose value over a window is a value
// of the window's summary, so one synthetic sample per window carrying
// it gives the engine the same result: minima and maxima exactly, sums
// and averages within rounding (the engine adds a window's samples with
// Kahan compensation, the store adds them in block order and block
// headers carry each block's sum).
var windowFuncs = map[string]func(buckets.Summary) float64{
	"avg_over_time": func(s buckets.Summary) float64 { return s.Avg() },
	"min_over_time": func(s buckets.Summary) float64 { return s.Min },
	"max_over_time": func(s buckets.Summary) float64 { return s.Max },
	"sum_over_time": func(s buckets.Summary) float64 { return s.Sum },
}

// windows describes the evaluation windows of a pushed-down selector:
// (end-rng, end] for end = first, first+step, ..., <= last (ms).
type windows struct {
	first, last, step, rng int64
	fn                     string
	value                  func(buckets.Summary) float64
}

// windowsOf decides whether a select can be answered per window. The
// engine evaluates the range at first = Start+Range-1 and every Step
// after it up to End; the windows must not overlap (Step >= Range) and
// first must be a multiple of Step, which holds for range queries with
// a step-aligned start (as Grafana sends them). A subquery evaluates
// its selects at the multiples of its step after Start+Range-1; when
// subquery says the select is in one (queryShape.inSubquery), the
// first window ends at the next multiple.
//
// An instant query (Step 0) is one window: of last_over_time (the
// newest sample of the window is its summary's last value) and of the
// functions above, which the store answers from block headers for the
// blocks inside the window and reads only the blocks cut by its edges.
func windowsOf(h *storage.SelectHints, subquery bool) (windows, bool) {
	if h != nil && h.Step == 0 && h.Range > 0 && h.Start+h.Range-1 == h.End {
		value, ok := windowFuncs[h.Func]
		if h.Func == "last_over_time" {
			value, ok = func(s buckets.Summary) float64 { return s.Last }, true
		}
		if !ok {
			return windows{}, false
		}
		return windows{first: h.End, last: h.End, step: h.Range, rng: h.Range, fn: h.Func, value: value}, true
	}
	if h == nil || h.Range <= 0 || h.Step <= 0 || h.Step < h.Range {
		return windows{}, false
	}
	value, ok := windowFuncs[h.Func]
	if !ok {
		return windows{}, false
	}
	first := h.Start + h.Range - 1
	if off := ((first % h.Step) + h.Step) % h.Step; off != 0 {
		if !subquery {
			return windows{}, false
		}
		first += h.Step - off
	}
	if first > h.End {
		return windows{}, false
	}
	return windows{first: first, last: h.End, step: h.Step, rng: h.Range, fn: h.Func, value: value}, true
}

// prefetchWorkers is how many devices' summaries are read at once.
const prefetchWorkers = 2

// newWindowIter returns an iterator over the windows of ref that reads
// them on first use.
func (s *seriesSet) newWindowIter(ref seriesRef) *windowIter {
	return &windowIter{ctx: s.ctx, agg: s.agg, dev: ref.dev, name: ref.name, w: *s.windows}
}

// windowIter yields one sample per window that holds a reading, at the
// window's end, with the window's function value. Summaries are read
// on the first call.
type windowIter struct {
	ctx  context.Context
	agg  Aggregator
	dev  buckets.DeviceID
	name string
	w    windows
	loadedSamples
}

func (it *windowIter) load() {
	it.read = true
	got, err := loadWindows(it.ctx, it.agg, it.dev, []string{it.name}, it.w)
	it.buf, it.err = got[it.name], err
}

// loadWindows reads the windows of w for the value names of dev, all
// names with each store call: per name, one sample per window that
// holds a reading.
func loadWindows(ctx context.Context, agg Aggregator, dev buckets.DeviceID, names []string, w windows) (map[string][]sample, error) {
	if w.first < w.last && w.step%w.rng == 0 && w.rng%1000 == 0 && w.step/w.rng <= maxGridRatio {
		return loadGrid(ctx, agg, dev, names, w)
	}
	out := make(map[string][]sample, len(names))
	for end := w.first; end <= w.last; end += w.step {
		sums, err := window(ctx, agg, dev, names, w, end)
		if err != nil {
			return nil, err
		}
		for i, n := range names {
			if sums[i].Count > 0 {
				out[n] = append(out[n], sample{end, w.value(sums[i])})
			}
		}
	}
	return out, nil
}

// maxGridRatio bounds step/range for the grid: beyond it most grid
// buckets would lie between windows, and windows are read one by one.
const maxGridRatio = 16

// window summarises (end-rng, end] for each of names with one store
// call: in ticks that is [end-rng+1ms, end+1ms), any reading of those
// milliseconds.
func window(ctx context.Context, agg Aggregator, dev buckets.DeviceID, names []string, w windows, end int64) ([]buckets.Summary, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	from, to := ticksOf(end-w.rng+1), ticksOf(end+1)
	interval := buckets.Ticks(w.rng) * 10000
	interval = (interval + buckets.TicksPerSecond - 1) / buckets.TicksPerSecond * buckets.TicksPerSecond
	page, err := agg.Aggregate(ctx, buckets.AggregateQuery{Device: dev, From: from, To: to,
		Interval: interval, Fields: names, Limit: 3, PerMillisecond: true})
	if err != nil {
		return nil, fmt.Errorf("aggregate %v of %s: %w", names, dev, err)
	}
	sums := make([]buckets.Summary, len(names))
	for _, b := range page.Buckets {
		for _, v := range b.Values {
			if i := slices.Index(names, v.Name); i >= 0 {
				sums[i].Merge(v.Summary)
			}
		}
	}
	return sums, nil
}

// loadGrid answers every window from one aggregate query whose buckets
// are the windows shifted by a millisecond. With ends aligned to the
// range, window (t-r, t] holds the readings of bucket [t-r, t) minus
// those of its first millisecond plus those of the first millisecond of
// bucket [t, t+r). A series has one sample per millisecond, so each of
// those slivers is the bucket's first reading when that falls within
// its first millisecond. When the reading taken out could be the
// window's minimum or maximum, or taking it out of a sum would lose
// precision, that window of that name is read with its own store call.
func loadGrid(ctx context.Context, agg Aggregator, dev buckets.DeviceID, names []string, w windows) (map[string][]sample, error) {
	r := buckets.Ticks(w.rng) * 10000
	from, to := ticksOf(w.first-w.rng), ticksOf(w.last+w.rng)
	var grids []grid
	q := buckets.AggregateQuery{Device: dev, From: from, To: to, Interval: r, Fields: names, PerMillisecond: true,
		Limit: int(min((to-from)/r+2, 10000))}
	for {
		page, err := agg.Aggregate(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("aggregate %v of %s: %w", names, dev, err)
		}
		if grids == nil && len(page.Buckets) > 0 {
			// From the oldest bucket with readings: a device's readings
			// often span a fraction of a long subquery's range.
			grids = make([]grid, len(names))
			for i := range grids {
				grids[i] = newGrid(page.Buckets[0].Start, to, r)
			}
		}
		for _, b := range page.Buckets {
			for _, v := range b.Values {
				if i := slices.Index(names, v.Name); i >= 0 {
					grids[i].set(b.Start, v.Summary)
				}
			}
		}
		if !page.More || len(page.Buckets) == 0 {
			break
		}
		last := page.Buckets[len(page.Buckets)-1].Start
		q.After = &last
	}
	out := make(map[string][]sample, len(names))
	if grids == nil {
		return out, nil
	}
	for i, n := range names {
		s, err := gridWindows(ctx, agg, dev, n, w, &grids[i])
		if err != nil {
			return nil, err
		}
		out[n] = s
	}
	return out, nil
}

// maxDenseGrid is the most buckets a grid keeps in a slice; a grid of
// more (a long span of short windows) keeps those that hold readings in
// a map.
const maxDenseGrid = 1 << 12

// grid holds the summaries of the buckets of width r from the one
// holding from to the one holding to, by bucket start; a bucket without
// readings is the zero Summary.
type grid struct {
	base, r buckets.Ticks
	dense   []buckets.Summary
	sparse  map[buckets.Ticks]buckets.Summary // when the grid is too long for dense
}

func newGrid(from, to, r buckets.Ticks) grid {
	base := from - mod(from-unixEpoch, r)
	n := (to-base)/r + 1
	if n <= maxDenseGrid {
		return grid{base: base, r: r, dense: make([]buckets.Summary, n)}
	}
	return grid{base: base, r: r, sparse: make(map[buckets.Ticks]buckets.Summary)}
}

// mod is x modulo m, in [0, m).
func mod(x, m buckets.Ticks) buckets.Ticks {
	if x %= m; x < 0 {
		x += m
	}
	return x
}

// index is the slot of the bucket starting at x in the dense grid, or
// -1 when x starts no bucket of it.
func (g *grid) index(x buckets.Ticks) int {
	if x < g.base || (x-g.base)%g.r != 0 || (x-g.base)/g.r >= buckets.Ticks(len(g.dense)) {
		return -1
	}
	return int((x - g.base) / g.r)
}

func (g *grid) set(x buckets.Ticks, s buckets.Summary) {
	if g.sparse != nil {
		g.sparse[x] = s
	} else if i := g.index(x); i >= 0 {
		g.dense[i] = s
	}
}

func (g *grid) at(x buckets.Ticks) buckets.Summary {
	if g.sparse != nil {
		return g.sparse[x]
	}
	if i := g.index(x); i >= 0 {
		return g.dense[i]
	}
	return buckets.Summary{}
}

// gridWindows makes the windows of name from its grid (see loadGrid).
func gridWindows(ctx context.Context, agg Aggregator, dev buckets.DeviceID, name string, w windows, grid *grid) ([]sample, error) {
	// sliver returns the first reading of the bucket at x when it lies in
	// the bucket's first millisecond.
	sliver := func(x buckets.Ticks) (float64, bool) {
		g := grid.at(x)
		if g.Count == 0 || g.FirstTicks >= x+10000 {
			return 0, false
		}
		return g.First, true
	}
	var out []sample
	for end := w.first; end <= w.last; end += w.step {
		if ticksOf(end) < grid.base { // before the device's oldest bucket
			continue
		}
		if out == nil {
			out = make([]sample, 0, (w.last-end)/w.step+1)
		}
		x := ticksOf(end - w.rng)
		g := grid.at(x)
		cut, in := sliver(x)
		add, hasAdd := sliver(ticksOf(end))
		sum, exact := g, true
		if in {
			switch w.fn {
			case "min_over_time":
				exact = cut != g.Min
			case "max_over_time":
				exact = cut != g.Max
			default: // sum and avg: subtracting must not lose precision
				exact = math.Abs(cut) <= 1e6*math.Abs(g.Sum-cut)
			}
			if g.Count == 1 {
				sum, exact = buckets.Summary{}, true
			} else {
				sum.Count--
				sum.Sum -= cut
			}
		}
		if !exact {
			sums, err := window(ctx, agg, dev, []string{name}, w, end)
			if err != nil {
				return nil, err
			}
			sum = sums[0]
		} else if hasAdd {
			sum.Merge(buckets.Summary{Count: 1, Sum: add, Min: add, Max: add, First: add, Last: add,
				FirstTicks: ticksOf(end), LastTicks: ticksOf(end)})
		}
		if sum.Count > 0 {
			out = append(out, sample{end, w.value(sum)})
		}
	}
	return out, nil
}

// windowSeekIter adds Seek (see seekingIter for the type parameter).
type windowSeekIter[T ~int64] struct{ *windowIter }

// Next implements chunkenc.Iterator.
func (it *windowIter) Next() chunkenc.ValueType { return it.next(it.load) }

// Seek implements chunkenc.Iterator.
func (it windowSeekIter[T]) Seek(t T) chunkenc.ValueType { return it.seek(int64(t), it.load) }

var _ chunkenc.Iterator = windowSeekIter[int64]{}
