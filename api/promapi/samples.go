package promapi

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/prometheus/storage"

	"github.com/telemetryd/telemetryd/buckets"
)

// SampleReader is the store's projected read. When Config.Source also
// implements it, a series' samples are read column by column, only the
// value names the query selects, instead of page by page of whole
// readings; and the series of one device that the selectors of a query
// select over the same span are read together, once.
type SampleReader interface {
	// Samples calls fn once for each of names that has numeric values
	// (ints as float64, bools as 0 or 1) among the readings of dev with
	// from <= ticks < to, with their ticks and values oldest first:
	// the values Range gives. ticks and vals are fn's to keep.
	Samples(ctx context.Context, dev buckets.DeviceID, from, to buckets.Ticks, names []string, fn func(name string, ticks []buckets.Ticks, vals []float64)) error
}

// dense reports whether the engine's evaluations of a select cover its
// span without gaps (an instant query, or steps no longer than the
// range or, for a plain selector, the lookback), so reading the whole
// span at once reads nothing the engine skips. Sparser steps read page
// by page from each step's time instead.
func dense(h *storage.SelectHints, lookback int64) bool {
	if h == nil {
		return false
	}
	covered := h.Range
	if covered == 0 {
		covered = lookback
	}
	return h.Step <= covered
}

// sampleSpan is a device and a span [from, to) of ticks: what one read
// of a SampleReader covers.
type sampleSpan struct {
	dev      buckets.DeviceID
	from, to buckets.Ticks
}

// sampleCache gathers, for one querier, the value names its selects
// want per device and span, and reads each device's names together the
// first time one of its series is iterated (the engine makes every
// select of a query before it iterates any series). While one span is
// used the next one wanted is read ahead, so the store's read of one
// device overlaps the engine's work on another; at most two reads are
// in flight. A series' samples are handed out once and then forgotten;
// a series iterated again is read again.
type sampleCache struct {
	src   SampleReader
	mu    sync.Mutex
	want  map[sampleSpan][]string
	order []sampleSpan       // spans in the order first wanted
	index map[sampleSpan]int // span -> index in order
	reads map[sampleSpan]*spanRead
	wg    sync.WaitGroup // reads in flight
}

// spanRead is the read of a span's wanted names; got and err are set
// when done is closed.
type spanRead struct {
	done chan struct{}
	got  map[string][]sample
	err  error
}

func newSampleCache(src SampleReader) *sampleCache {
	return &sampleCache{src: src, want: map[sampleSpan][]string{}, index: map[sampleSpan]int{},
		reads: map[sampleSpan]*spanRead{}}
}

// add registers the series name of sp as one a select wants.
func (c *sampleCache) add(sp sampleSpan, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.index[sp]; !ok {
		c.index[sp] = len(c.order)
		c.order = append(c.order, sp)
	}
	for _, n := range c.want[sp] {
		if n == name {
			return
		}
	}
	c.want[sp] = append(c.want[sp], name)
}

// start reads the wanted names of sp in a goroutine; c.mu is held.
func (c *sampleCache) start(ctx context.Context, sp sampleSpan) *spanRead {
	r := &spanRead{done: make(chan struct{})}
	c.reads[sp] = r
	names := c.want[sp]
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(r.done)
		r.got, r.err = c.read(ctx, sp, names)
	}()
	return r
}

// take returns the samples of the series name of sp, one per
// millisecond, reading every wanted name of sp the first time.
func (c *sampleCache) take(ctx context.Context, sp sampleSpan, name string) ([]sample, error) {
	c.mu.Lock()
	r := c.reads[sp]
	if r == nil {
		if len(c.want[sp]) == 0 {
			c.want[sp] = []string{name}
		}
		r = c.start(ctx, sp)
	}
	if i, ok := c.index[sp]; ok && i+1 < len(c.order) && c.reads[c.order[i+1]] == nil {
		c.start(ctx, c.order[i+1])
	}
	c.mu.Unlock()
	<-r.done
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.err != nil {
		return nil, r.err
	}
	if s, ok := r.got[name]; ok {
		delete(r.got, name)
		return s, nil
	}
	// Iterated before: read it alone.
	one, err := c.read(ctx, sp, []string{name})
	return one[name], err
}

// wait waits for the reads in flight.
func (c *sampleCache) wait() { c.wg.Wait() }

// read reads names of sp, every name present in the answer.
func (c *sampleCache) read(ctx context.Context, sp sampleSpan, names []string) (map[string][]sample, error) {
	got := make(map[string][]sample, len(names))
	for _, n := range names {
		got[n] = nil
	}
	err := c.src.Samples(ctx, sp.dev, sp.from, sp.to, names, func(name string, ticks []buckets.Ticks, vals []float64) {
		got[name] = perMillisecond(ticks, vals)
	})
	if err != nil {
		return nil, fmt.Errorf("read %v of %s: %w", names, sp.dev, err)
	}
	return got, nil
}

// perMillisecond makes values at increasing ticks samples, one per
// millisecond: the newest of the values that share one.
func perMillisecond(ticks []buckets.Ticks, vals []float64) []sample {
	out := make([]sample, 0, len(ticks))
	for i, k := range ticks {
		t := msOf(k)
		if n := len(out); n > 0 && out[n-1].t == t {
			out[n-1].f = vals[i]
			continue
		}
		out = append(out, sample{t, vals[i]})
	}
	return out
}

// loadedIter is an iterator over samples already read: a sampleIter
// with nothing more to read.
func loadedIter(ctx context.Context, c *sampleCache, sp sampleSpan, name string) seekingIter[int64] {
	s, err := c.take(ctx, sp, name)
	return seekingIter[int64]{&sampleIter{ctx: ctx, dev: sp.dev, name: name, done: true, buf: s, i: -1, err: err}}
}
