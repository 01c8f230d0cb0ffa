package promapi

import (
	"context"
	"fmt"
	"math"
	"sync"

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
var windowFuncs = map[string]func(*buckets.Summary) float64{
	"avg_over_time": func(s *buckets.Summary) float64 { return s.Avg() },
	"min_over_time": func(s *buckets.Summary) float64 { return s.Min },
	"max_over_time": func(s *buckets.Summary) float64 { return s.Max },
	"sum_over_time": func(s *buckets.Summary) float64 { return s.Sum },
}

// windows describes the evaluation windows of a pushed-down selector:
// (end-rng, end] for end = first, first+step, ..., <= last (ms).
type windows struct {
	first, last, step, rng int64
	fn                     string
	value                  func(*buckets.Summary) float64
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
			value, ok = func(s *buckets.Summary) float64 { return s.Last }, true
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

// prefetchWorkers is how many series' summaries are read at once.
const prefetchWorkers = 2

// newWindowIter returns an iterator over the windows of ref.
func (s *seriesSet) newWindowIter(ref seriesRef) *windowIter {
	return &windowIter{ctx: s.ctx, agg: s.agg, dev: ref.dev, name: ref.name, w: *s.windows}
}

// prefetch reads the summaries of every series with a few workers, so
// the store's reads of different devices overlap. It is skipped when
// the samples could exceed the engine's sample limit (the engine then
// stops the query as it iterates).
func (s *seriesSet) prefetch() {
	perSeries := (s.windows.last-s.windows.first)/s.windows.step + 1
	if len(s.refs) < 2 || int64(len(s.refs))*perSeries > int64(s.q.maxSamples) {
		return
	}
	s.loaded = make([]*windowIter, len(s.refs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(prefetchWorkers, len(s.refs)) {
		wg.Go(func() {
			for i := range next {
				it := s.newWindowIter(s.refs[i])
				it.load()
				s.loaded[i] = it
			}
		})
	}
	for i := range s.refs {
		if s.refs[i].seen == nil { // LastSeenName is never a summary
			next <- i
		}
	}
	close(next)
	wg.Wait()
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
	if it.w.first < it.w.last && it.w.step%it.w.rng == 0 && it.w.rng%1000 == 0 && it.w.step/it.w.rng <= maxGridRatio {
		it.err = it.loadGrid()
		return
	}
	for end := it.w.first; end <= it.w.last; end += it.w.step {
		sum, err := it.window(end)
		if err != nil {
			it.err = err
			return
		}
		if sum.Count > 0 {
			it.buf = append(it.buf, sample{end, it.w.value(&sum)})
		}
	}
}

// maxGridRatio bounds step/range for the grid: beyond it most grid
// buckets would lie between windows, and windows are read one by one.
const maxGridRatio = 16

// window summarises (end-rng, end] with one store call: in ticks that is
// [end-rng+1ms, end+1ms), any reading of those milliseconds.
func (it *windowIter) window(end int64) (buckets.Summary, error) {
	if err := it.ctx.Err(); err != nil {
		return buckets.Summary{}, err
	}
	from, to := ticksOf(end-it.w.rng+1), ticksOf(end+1)
	interval := buckets.Ticks(it.w.rng) * 10000
	interval = (interval + buckets.TicksPerSecond - 1) / buckets.TicksPerSecond * buckets.TicksPerSecond
	page, err := it.agg.Aggregate(it.ctx, buckets.AggregateQuery{Device: it.dev, From: from, To: to,
		Interval: interval, Fields: []string{it.name}, Limit: 3, PerMillisecond: true})
	if err != nil {
		return buckets.Summary{}, fmt.Errorf("aggregate %s of %s: %w", it.name, it.dev, err)
	}
	var sum buckets.Summary
	for _, b := range page.Buckets {
		for _, v := range b.Values {
			if v.Name == it.name {
				sum.Merge(v.Summary)
			}
		}
	}
	return sum, nil
}

// loadGrid answers every window from one aggregate query whose buckets
// are the windows shifted by a millisecond. With ends aligned to the
// range, window (t-r, t] holds the readings of bucket [t-r, t) minus
// those of its first millisecond plus those of the first millisecond of
// bucket [t, t+r). A series has one sample per millisecond, so each of
// those slivers is the bucket's first reading when that falls within
// its first millisecond. When the reading taken out could be the
// window's minimum or maximum, or taking it out of a sum would lose
// precision, that window is read with its own store call.
func (it *windowIter) loadGrid() error {
	r := buckets.Ticks(it.w.rng) * 10000
	from, to := ticksOf(it.w.first-it.w.rng), ticksOf(it.w.last+it.w.rng)
	grid := make(map[buckets.Ticks]buckets.Summary, min((to-from)/r+2, 10000))
	q := buckets.AggregateQuery{Device: it.dev, From: from, To: to, Interval: r, Fields: []string{it.name}, PerMillisecond: true,
		Limit: int(min((to-from)/r+2, 10000))}
	for {
		page, err := it.agg.Aggregate(it.ctx, q)
		if err != nil {
			return fmt.Errorf("aggregate %s of %s: %w", it.name, it.dev, err)
		}
		for _, b := range page.Buckets {
			for _, v := range b.Values {
				if v.Name == it.name {
					grid[b.Start] = v.Summary
				}
			}
		}
		if !page.More || len(page.Buckets) == 0 {
			break
		}
		last := page.Buckets[len(page.Buckets)-1].Start
		q.After = &last
	}
	// sliver returns the first reading of the bucket at x when it lies in
	// the bucket's first millisecond.
	sliver := func(x buckets.Ticks) (float64, bool) {
		g, ok := grid[x]
		if !ok || g.Count == 0 || g.FirstTicks >= x+10000 {
			return 0, false
		}
		return g.First, true
	}
	for end := it.w.first; end <= it.w.last; end += it.w.step {
		x := ticksOf(end - it.w.rng)
		g := grid[x]
		out, in := sliver(x)
		add, hasAdd := sliver(ticksOf(end))
		sum, exact := g, true
		if in {
			switch it.w.fn {
			case "min_over_time":
				exact = out != g.Min
			case "max_over_time":
				exact = out != g.Max
			default: // sum and avg: subtracting must not lose precision
				exact = math.Abs(out) <= 1e6*math.Abs(g.Sum-out)
			}
			if g.Count == 1 {
				sum, exact = buckets.Summary{}, true
			} else {
				sum.Count--
				sum.Sum -= out
			}
		}
		if !exact {
			var err error
			if sum, err = it.window(end); err != nil {
				return err
			}
		} else if hasAdd {
			sum.Merge(buckets.Summary{Count: 1, Sum: add, Min: add, Max: add, First: add, Last: add,
				FirstTicks: ticksOf(end), LastTicks: ticksOf(end)})
		}
		if sum.Count > 0 {
			it.buf = append(it.buf, sample{end, it.w.value(&sum)})
		}
	}
	return nil
}

// windowSeekIter adds Seek (see seekingIter for the type parameter).
type windowSeekIter[T ~int64] struct{ *windowIter }

// Next implements chunkenc.Iterator.
func (it *windowIter) Next() chunkenc.ValueType { return it.next(it.load) }

// Seek implements chunkenc.Iterator.
func (it windowSeekIter[T]) Seek(t T) chunkenc.ValueType { return it.seek(int64(t), it.load) }

var _ chunkenc.Iterator = windowSeekIter[int64]{}
