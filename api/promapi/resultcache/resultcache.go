// Package resultcache keeps the answers of PromQL range queries by
// step, so that a dashboard whose window slides on evaluates only the
// steps it has not answered before (its new tail) and takes the others
// from the answer before.
//
// An answer is kept per query text, step and phase (the start modulo
// the step): the steps of every window of one key lie on one grid. The
// value at a step depends only on that step and on the data (the
// caller keeps out queries with @ modifiers and negative offsets), so
// a reading with time t changes no step before t: when readings are
// committed, every kept answer lets go of its steps at and after the
// oldest of them, and an answer being evaluated meanwhile is kept only
// up to there. When readings may have gone (a device deleted, a day
// dropped) or device attributes changed (series labels and groupings),
// every answer is let go of.
//
// The kept answers together stay within a byte bound; the least
// recently used go first.
package resultcache

import (
	"math"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
)

// Key names the answers of one query on one grid of steps.
type Key struct {
	Query string
	Step  int64 // ms
	Phase int64 // the start modulo Step, ms
}

// KeyOf is the key of query asked from start at step (ms).
func KeyOf(query string, start, step int64) Key {
	return Key{Query: query, Step: step, Phase: ((start % step) + step) % step}
}

// Cache is the kept answers. Its methods are safe for concurrent use.
type Cache struct {
	max    int64
	active atomic.Int64 // entries and fills: Committed has work to do

	mu      sync.Mutex
	entries map[Key]*entry
	fills   map[*Fill]struct{}
	used    int64  // bytes of the entries
	clock   uint64 // counts Gets, for least recently used
	gen     uint64 // counts Removed
	stats   Stats
}

// Stats counts what the cache did.
type Stats struct {
	Hits, Partial, Misses int64 // Gets answered whole, in part, not at all
	Kept, Evicted         int64 // answers stored, answers let go for room
	Bytes                 int64 // held now
}

// entry is one kept answer: every step from first to last (ms).
type entry struct {
	first, last int64
	step        int64
	attrs       uint64
	m           promql.Matrix // points within [first, last] only; never changed in place
	bytes       int64
	used        uint64
}

// Fill is an evaluation begun by Get whose answer Put may keep.
type Fill struct {
	key    Key
	gen    uint64
	attrs  uint64
	before int64 // a commit since holds readings this old: steps at or after it are not kept
}

// New makes a cache that keeps at most maxBytes of answers (estimated:
// labels and 16 bytes a point).
func New(maxBytes int64) *Cache {
	return &Cache{max: maxBytes, entries: map[Key]*entry{}, fills: map[*Fill]struct{}{}}
}

// Get looks up the steps of [start, end] (ms, on k's grid) kept for k
// with the attribute generation attrs. It returns the kept series
// within [start, end], shared (callers only read them), and next, the
// first step it does not answer: start when nothing is kept, beyond end
// when everything is. The fill it begins must end with Put or Drop.
// Only a window that begins within a kept one is answered in part.
func (c *Cache) Get(k Key, start, end int64, attrs uint64) (kept promql.Matrix, next int64, f *Fill) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f = &Fill{key: k, gen: c.gen, attrs: attrs, before: math.MaxInt64}
	c.fills[f] = struct{}{}
	c.active.Add(1)
	e := c.entries[k]
	if e != nil && e.attrs != attrs {
		c.remove(k, e)
		e = nil
	}
	if e == nil || start < e.first || start > e.last {
		c.stats.Misses++
		return nil, start, f
	}
	c.clock++
	e.used = c.clock
	to := min(end, e.last)
	if to == end {
		c.stats.Hits++
	} else {
		c.stats.Partial++
	}
	return window(e.m, start, to), to + k.Step, f
}

// Put ends f and keeps m, the answer of [start, end] (ms), unless
// readings were removed or attributes changed (attrs is the generation
// now) since f began; steps at or after the oldest reading committed
// since are left out.
func (c *Cache) Put(f *Fill, m promql.Matrix, start, end int64, attrs uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endFill(f)
	if f.gen != c.gen || f.attrs != attrs {
		return
	}
	last := lastBefore(start, end, f.key.Step, f.before)
	if last < start {
		return
	}
	e := &entry{first: start, last: last, step: f.key.Step, attrs: attrs, m: window(m, start, last)}
	e.bytes = sizeOf(e.m)
	if e.bytes > c.max {
		return
	}
	if old := c.entries[f.key]; old != nil {
		c.remove(f.key, old)
	}
	for c.used+e.bytes > c.max {
		c.evictOldest()
	}
	c.clock++
	e.used = c.clock
	c.entries[f.key] = e
	c.used += e.bytes
	c.active.Add(1)
	c.stats.Kept++
}

// Drop ends f without keeping anything.
func (c *Cache) Drop(f *Fill) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endFill(f)
}

func (c *Cache) endFill(f *Fill) {
	if _, ok := c.fills[f]; ok {
		delete(c.fills, f)
		c.active.Add(-1)
	}
}

// Active tells whether anything is kept or being evaluated: when not,
// Committed has nothing to do.
func (c *Cache) Active() bool { return c.active.Load() > 0 }

// Committed is told that readings as old as t (ms) were committed:
// every kept step at or after t is let go of, and so is every such step
// of the evaluations under way.
func (c *Cache) Committed(t int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for f := range c.fills {
		f.before = min(f.before, t)
	}
	for k, e := range c.entries {
		if e.last < t {
			continue
		}
		last := lastBefore(e.first, e.last, e.step, t)
		if last < e.first {
			c.remove(k, e)
			continue
		}
		c.used -= e.bytes
		e.last, e.m = last, window(e.m, e.first, last)
		e.bytes = sizeOf(e.m)
		c.used += e.bytes
	}
}

// Removed is told that readings may have gone or changed other than by
// a commit: everything kept is let go of, and no evaluation under way
// is kept.
func (c *Cache) Removed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for k, e := range c.entries {
		c.remove(k, e)
	}
}

// Stats returns what the cache did so far.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Bytes = c.used
	return s
}

func (c *Cache) remove(k Key, e *entry) {
	delete(c.entries, k)
	c.used -= e.bytes
	c.active.Add(-1)
}

func (c *Cache) evictOldest() {
	var (
		oldest *entry
		key    Key
	)
	for k, e := range c.entries {
		if oldest == nil || e.used < oldest.used {
			oldest, key = e, k
		}
	}
	c.remove(key, oldest)
	c.stats.Evicted++
}

// lastBefore is the last step of start, start+step, ... up to end that
// is before t (start-step when none is).
func lastBefore(start, end, step, t int64) int64 {
	if end < t {
		return end
	}
	if t <= start {
		return start - step
	}
	return start + (t-1-start)/step*step
}

// window is the series of m with their points within [from, to] (ms),
// those with none left out. The points are m's, not copies.
func window(m promql.Matrix, from, to int64) promql.Matrix {
	out := make(promql.Matrix, 0, len(m))
	for _, s := range m {
		i := sort.Search(len(s.Floats), func(i int) bool { return s.Floats[i].T >= from })
		j := sort.Search(len(s.Floats), func(i int) bool { return s.Floats[i].T > to })
		if i < j {
			out = append(out, promql.Series{Metric: s.Metric, Floats: s.Floats[i:j:j], DropName: s.DropName})
		}
	}
	return out
}

// sizeOf estimates the bytes m holds.
func sizeOf(m promql.Matrix) int64 {
	var n int64
	for _, s := range m {
		n += 64 + int64(len(s.Floats))*16
		s.Metric.Range(func(l labels.Label) { n += int64(len(l.Name)+len(l.Value)) + 32 })
	}
	return n
}

// Merge is the answer made of kept, the kept steps, and fresh, the
// evaluation of the steps after them: the series of both, each with
// kept's points and then fresh's, sorted by labels as the engine sorts
// a range query's answer. Its points are copies, so fresh may be given
// back to the engine's pools.
func Merge(kept, fresh promql.Matrix) promql.Matrix {
	byLabels := make(map[uint64][]int, len(kept)+len(fresh))
	out := make(promql.Matrix, 0, max(len(kept), len(fresh)))
	find := func(l labels.Labels) int {
		h := l.Hash()
		for _, i := range byLabels[h] {
			if labels.Equal(out[i].Metric, l) {
				return i
			}
		}
		out = append(out, promql.Series{Metric: l})
		byLabels[h] = append(byLabels[h], len(out)-1)
		return len(out) - 1
	}
	for _, part := range []promql.Matrix{kept, fresh} {
		for _, s := range part {
			i := find(s.Metric)
			out[i].Floats = append(out[i].Floats, s.Floats...)
			out[i].DropName = out[i].DropName || s.DropName
		}
	}
	sort.Sort(out)
	return out
}
