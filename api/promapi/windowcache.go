package promapi

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/telemetryd/telemetryd/buckets"
)

// windowKey is a device and the windows of a pushed-down select, with
// the function (which decides how the grid's edges are corrected): the
// series of one query that share it are read with one store call.
type windowKey struct {
	dev                    buckets.DeviceID
	first, last, step, rng int64
	fn                     string
}

func keyOf(dev buckets.DeviceID, w *windows) windowKey {
	return windowKey{dev: dev, first: w.first, last: w.last, step: w.step, rng: w.rng, fn: w.fn}
}

// windowCache gathers, for one querier, the value names its
// pushed-down selects want per device and windows, and reads them the
// first time a series of one of them is iterated (the engine makes every
// select of a query before it iterates any series): each key's names
// with one store call, a few keys at once. So the two series of a truck
// in `last_over_time(lat[6h])` and `last_over_time(long[6h])`, or in
// one selector of both, read the truck's blocks once.
type windowCache struct {
	agg     Aggregator
	mu      sync.Mutex
	want    map[windowKey][]string
	wins    map[windowKey]windows
	order   []windowKey // keys in the order first wanted
	got     map[windowKey]map[string][]sample
	errs    map[windowKey]error
	samples int64 // the most samples the wanted series can have
}

func newWindowCache(agg Aggregator) *windowCache {
	return &windowCache{agg: agg, want: map[windowKey][]string{}, wins: map[windowKey]windows{},
		got: map[windowKey]map[string][]sample{}, errs: map[windowKey]error{}}
}

// addSet registers the series of refs with windows w, unless their
// samples together with those registered before could exceed
// maxSamples (the engine then stops the query as it iterates, and
// series are read one by one); it reports whether it did.
func (c *windowCache) addSet(refs []seriesRef, w *windows, maxSamples int) bool {
	perSeries := (w.last-w.first)/w.step + 1
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.samples+int64(len(refs))*perSeries > int64(maxSamples) {
		return false
	}
	c.samples += int64(len(refs)) * perSeries
	for _, r := range refs {
		if r.hasSeen { // LastSeenName is never a summary
			continue
		}
		k := keyOf(r.dev, w)
		if _, ok := c.wins[k]; !ok {
			c.wins[k] = *w
			c.order = append(c.order, k)
		}
		if !containsString(c.want[k], r.name) {
			c.want[k] = append(c.want[k], r.name)
		}
	}
	return true
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// take returns the samples of the series name of key k, reading every
// key not read yet first. The samples are shared: callers only read
// them.
func (c *windowCache) take(ctx context.Context, k windowKey, name string) ([]sample, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.got[k]; !ok && c.errs[k] == nil {
		c.readPending(ctx)
	}
	if err := c.errs[k]; err != nil {
		return nil, err
	}
	return c.got[k][name], nil
}

// readPending reads the keys not read yet with prefetchWorkers
// workers; c.mu is held.
func (c *windowCache) readPending(ctx context.Context) {
	var pending []windowKey
	for _, k := range c.order {
		if _, ok := c.got[k]; !ok && c.errs[k] == nil {
			pending = append(pending, k)
		}
	}
	type result struct {
		got map[string][]sample
		err error
	}
	res := make([]result, len(pending))
	// The workers, the caller among them, take the next key in turn:
	// handing each key over a channel cost a switch of goroutines per
	// device.
	var next atomic.Int64
	work := func() {
		for i := next.Add(1) - 1; i < int64(len(pending)); i = next.Add(1) - 1 {
			k := pending[i]
			res[i].got, res[i].err = loadWindows(ctx, c.agg, k.dev, c.want[k], c.wins[k])
		}
	}
	var wg sync.WaitGroup
	for range min(prefetchWorkers, len(pending)) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	for i, k := range pending {
		if res[i].err != nil {
			c.errs[k] = res[i].err
			continue
		}
		c.got[k] = res[i].got
	}
}
