package promapi

import (
	"context"
	"slices"
	"sync"
	"time"
	"unique"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/telemetryd/telemetryd/buckets"
)

// watchable is a Source that tells of every change to its readings
// (store.Store.Watch): the API then keeps the recent samples of the
// devices its shared selects read in memory (liveWindow).
type watchable interface {
	Watch(committed func([]buckets.Reading), removed func(buckets.DeviceID)) (stop func())
}

// Bounds of the live window.
const (
	// liveMaxSamples bounds the samples, reading times, series labels
	// and devices the live window holds (about 24 bytes each, more for
	// labels); past it, devices are no
	// longer added (their selects read the store) until idle ones are
	// swept out.
	liveMaxSamples = 2 << 20
	// liveSlack is how far before the lookback delta, back from the
	// clock, the window keeps samples: an evaluation that runs up to
	// this late still finds its whole span in memory.
	liveSlack = time.Minute
	// liveSweepEvery is how often, at most, a full window looks for
	// devices that sent nothing within the span it keeps.
	liveSweepEvery = time.Minute
)

// liveWindow keeps, per device that a shared select (SharedReads) read,
// every reading time and numeric sample from the device's from on:
// first read from the store, then followed commit by commit (watchable),
// so the rules' selects of a device that sends every interval read no
// store at all. Samples older than the lookback delta and liveSlack
// before the clock are let go. A select of a device the window does not
// hold, or further back than it holds, reads the store (recentReads).
type liveWindow struct {
	now  func() time.Time
	keep int64 // ms before now the window keeps
	max  int   // liveMaxSamples; tests lower it

	mu        sync.Mutex
	gen       uint64 // counts removals: a read begun before one is not kept
	epoch     uint64 // counts changes of devs' entries (deviceList.liveAt)
	devs      map[buckets.DeviceID]*liveDevice
	n         int // samples and reading times held
	lastSweep time.Time
}

// liveDevice is what the window holds of one device: complete for
// readings at or after from once ready (its store read is merged in).
type liveDevice struct {
	from  buckets.Ticks
	ready bool
	// newest is, for the first liveInlineCols columns, the name and the
	// newest sample, beside from and ready: a select of the newest
	// sample of a device (an instant selector) reads the first two
	// cache lines of its entry and no other memory of the device.
	newest [liveInlineCols]liveColNewest
	// cols are few, found by a scan: the first liveInlineCols are held
	// in the entry itself (colsBuf), beside what a select reads first.
	cols    []liveCol
	colsBuf [liveInlineCols]liveCol
	ticks   []buckets.Ticks // every reading's time, ascending
	n       int             // samples and times held
	touched int64           // ms of the clock at the last commit or read
	// labels are the labels of the device's series that selects
	// matched, with the attributes they were made of.
	labels []liveLabels
}

// liveColNewest is a column's name and newest sample; ok is false when
// the column holds none, or two readings share one of its milliseconds
// (its samples are then made by slice).
type liveColNewest struct {
	name unique.Handle[string]
	s    sample
	ok   bool
}

// syncNewest sets e.newest from e's first columns, after they changed.
func (e *liveDevice) syncNewest() {
	for i := range e.newest {
		if i >= len(e.cols) {
			e.newest[i] = liveColNewest{}
			continue
		}
		c := &e.cols[i]
		n := liveColNewest{name: c.name, ok: !c.dup && len(c.s) > 0}
		if n.ok {
			n.s = c.s[len(c.s)-1]
		}
		e.newest[i] = n
	}
}

// newestOf returns the newest sample of name, when the entry holds it
// among newest (ok).
func (e *liveDevice) newestOf(name unique.Handle[string]) (sample, bool) {
	for i := range e.newest {
		if e.newest[i].name == name {
			return e.newest[i].s, e.newest[i].ok
		}
	}
	return sample{}, false
}

type liveLabels struct {
	name  unique.Handle[string]
	attrs buckets.Attributes
	lset  labels.Labels
}

// labelsOf is seriesLabels(name, d), made again only when d's
// attributes changed since it was last made; w.mu is held. Each kept
// counts as a sample towards the window's bound.
func (w *liveWindow) labelsOf(e *liveDevice, name unique.Handle[string], d *buckets.DeviceInfo) labels.Labels {
	for i := range e.labels {
		l := &e.labels[i]
		if l.name != name {
			continue
		}
		if !slices.Equal(l.attrs, d.Attributes) {
			l.attrs, l.lset = d.Attributes, seriesLabels(name.Value(), d)
		}
		return l.lset
	}
	if len(e.labels) >= recentMaxNames {
		return seriesLabels(name.Value(), d)
	}
	l := seriesLabels(name.Value(), d)
	e.labels = append(e.labels, liveLabels{name: name, attrs: d.Attributes, lset: l})
	e.n++
	w.n++
	return l
}

// liveInlineCols is how many columns a live device holds without an
// allocation of their own: a select that finds a column then reads no
// other memory of the device before its samples.
const liveInlineCols = 3

// addCol appends c to e's columns and returns it.
func (e *liveDevice) addCol(c liveCol) *liveCol {
	if e.cols == nil {
		e.cols = e.colsBuf[:0]
	}
	e.cols = append(e.cols, c)
	return &e.cols[len(e.cols)-1]
}

// liveCol is one value name's samples, one per reading, ascending. A
// slice handed out is never changed: a change other than an append
// copies first. Names are unique handles: finding a column compares
// pointers, not the names' bytes.
type liveCol struct {
	name unique.Handle[string]
	k    []buckets.Ticks
	s    []sample // s[i].t is msOf(k[i])
	dup  bool     // two readings share a millisecond
}

func newLiveWindow(now func() time.Time, lookback int64) *liveWindow {
	return &liveWindow{now: now, keep: lookback + liveSlack.Milliseconds(), max: liveMaxSamples,
		devs: map[buckets.DeviceID]*liveDevice{}}
}

// cut is the oldest time the window keeps; w.mu is held.
func (w *liveWindow) cut(nowMs int64) buckets.Ticks { return ticksOf(nowMs - w.keep) }

// committed follows one commit of the store.
func (w *liveWindow) committed(rs []buckets.Reading) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.devs) == 0 {
		return
	}
	nowMs := w.now().UnixMilli()
	cut := w.cut(nowMs)
	for i := range rs {
		r := &rs[i]
		e := w.devs[r.Device]
		if e == nil || r.Ticks < e.from {
			continue
		}
		before := e.n
		e.add(r)
		e.touched = nowMs
		if e.from < cut {
			e.trim(cut)
		}
		w.n += e.n - before
		if w.n > w.max {
			delete(w.devs, r.Device)
			w.epoch++
			w.n -= e.n
		}
	}
}

// removed forgets what readings may have gone from.
func (w *liveWindow) removed(dev buckets.DeviceID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gen++
	if dev == "" {
		clear(w.devs)
		w.epoch++
		w.n = 0
		return
	}
	if e := w.devs[dev]; e != nil {
		delete(w.devs, dev)
		w.epoch++
		w.n -= e.n
	}
}

// take returns the samples of name of dev in [from, to), and true, when
// the window holds dev from before from, reading the device's samples
// from the store first when it does not hold the device yet. false:
// the caller reads the store (the window is full, or another select is
// reading the device). The slice is shared: the caller must not modify
// it.
func (w *liveWindow) take(ctx context.Context, src Source, dev buckets.DeviceID, from, to buckets.Ticks, name unique.Handle[string]) ([]sample, bool, error) {
	w.mu.Lock()
	nowMs := w.now().UnixMilli()
	e := w.devs[dev]
	if e != nil && e.ready && e.from <= from {
		s := e.slice(name, from, to)
		w.mu.Unlock()
		return s, true, nil
	}
	if (e != nil && !e.ready) || from < w.cut(nowMs) { // being read, or older than the window keeps
		w.mu.Unlock()
		return nil, false, nil
	}
	if e != nil {
		delete(w.devs, dev)
		w.epoch++
		w.n -= e.n
	}
	if w.n >= w.max && !w.sweep(nowMs) {
		w.mu.Unlock()
		return nil, false, nil
	}
	e = &liveDevice{from: min(from, w.cut(nowMs)), touched: nowMs, n: 1}
	w.devs[dev] = e
	w.epoch++
	w.n++
	gen := w.gen
	w.mu.Unlock()

	seed := &liveDevice{from: e.from}
	err := readAll(ctx, src, dev, e.from, func(r *buckets.Reading) { seed.add(r) })

	w.mu.Lock()
	defer w.mu.Unlock()
	if w.devs[dev] != e { // removed, or dropped past the bound
		return nil, false, err
	}
	if err != nil || w.gen != gen {
		delete(w.devs, dev)
		w.epoch++
		w.n -= e.n
		return nil, false, err
	}
	before := e.n
	e.merge(seed)
	e.ready = true
	e.trim(w.cut(nowMs))
	w.n += e.n - before
	s := e.slice(name, from, to)
	if w.n > w.max {
		delete(w.devs, dev)
		w.epoch++
		w.n -= e.n
	}
	return s, true, nil
}

// newestUpTo returns the time of dev's newest reading at or before t
// (ms), and whether it is known: the window holds dev from at or before
// t. found is false when it holds no reading of dev in [from, t].
func (w *liveWindow) newestUpTo(dev buckets.DeviceID, t int64) (k buckets.Ticks, found, known bool) {
	end := ticksOf(t + 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.devs[dev]
	if e == nil || !e.ready || e.from >= end {
		return 0, false, false
	}
	i, _ := slices.BinarySearch(e.ticks, end)
	if i == 0 {
		return 0, false, false // older than the window
	}
	return e.ticks[i-1], true, true
}

// sweep lets go of the devices that sent nothing within the span kept,
// at most every liveSweepEvery, and reports whether that made room.
func (w *liveWindow) sweep(nowMs int64) bool {
	now := time.UnixMilli(nowMs)
	if now.Sub(w.lastSweep) < liveSweepEvery {
		return false
	}
	w.lastSweep = now
	for dev, e := range w.devs {
		if e.touched < nowMs-w.keep {
			delete(w.devs, dev)
			w.epoch++
			w.n -= e.n
		}
	}
	return w.n < w.max
}

// readAll calls fn for each reading of dev from from on, oldest first.
func readAll(ctx context.Context, src Source, dev buckets.DeviceID, from buckets.Ticks, fn func(*buckets.Reading)) error {
	q := buckets.RangeQuery{Device: dev, From: from, To: buckets.MaxTicks, Order: buckets.Asc, Limit: defaultPageSize}
	for {
		page, err := src.Range(ctx, q)
		if err != nil {
			return err
		}
		for i := range page.Readings {
			fn(&page.Readings[i])
		}
		if !page.More || len(page.Readings) == 0 {
			return nil
		}
		last := page.Readings[len(page.Readings)-1].Ticks
		q.After = &last
	}
}

// add records r: its time, and its numeric values (a value of another
// kind replaces a number at the same time, so that one goes).
func (e *liveDevice) add(r *buckets.Reading) {
	if i, ok := slices.BinarySearch(e.ticks, r.Ticks); !ok {
		if i == len(e.ticks) {
			e.ticks = append(e.ticks, r.Ticks)
		} else {
			e.ticks = slices.Insert(slices.Clone(e.ticks), i, r.Ticks)
		}
		e.n++
	}
	for _, f := range r.Values {
		name := unique.Make(f.Name)
		c := e.col(name)
		v, ok := buckets.Numeric(f.Value)
		switch {
		case ok && c == nil:
			c = e.addCol(liveCol{name: name})
			fallthrough
		case ok:
			e.n += c.put(r.Ticks, v)
		case c != nil:
			e.n -= c.drop(r.Ticks)
		}
	}
	e.syncNewest()
}

// put sets the value at k and returns how many samples it added.
func (c *liveCol) put(k buckets.Ticks, v float64) int {
	t := msOf(k)
	n := len(c.k)
	if n == 0 || k > c.k[n-1] {
		if n > 0 && c.s[n-1].t == t {
			c.dup = true
		}
		c.k, c.s = append(c.k, k), append(c.s, sample{t, v})
		return 1
	}
	i, found := slices.BinarySearch(c.k, k)
	c.k, c.s = slices.Clone(c.k), slices.Clone(c.s)
	if found {
		c.s[i].f = v
		return 0
	}
	c.k, c.s = slices.Insert(c.k, i, k), slices.Insert(c.s, i, sample{t, v})
	c.dup = c.dup || (i > 0 && c.s[i-1].t == t) || (i+1 < len(c.s) && c.s[i+1].t == t)
	return 1
}

// drop removes the value at k and returns how many samples went.
func (c *liveCol) drop(k buckets.Ticks) int {
	i, found := slices.BinarySearch(c.k, k)
	if !found {
		return 0
	}
	c.k = slices.Delete(slices.Clone(c.k), i, i+1)
	c.s = slices.Delete(slices.Clone(c.s), i, i+1)
	return 1
}

// merge adds what the store read (seed) under what commits added since
// the device was added: a commit is newer than the read.
func (e *liveDevice) merge(seed *liveDevice) {
	for _, k := range seed.ticks {
		if i, ok := slices.BinarySearch(e.ticks, k); !ok {
			e.ticks = slices.Insert(e.ticks, i, k)
			e.n++
		}
	}
	for _, sc := range seed.cols {
		c := e.col(sc.name)
		if c == nil {
			e.addCol(sc)
			e.n += len(sc.k)
			continue
		}
		for i, k := range sc.k {
			if _, ok := slices.BinarySearch(c.k, k); !ok {
				e.n += c.put(k, sc.s[i].f)
			}
		}
	}
	e.syncNewest()
}

// col is the column of name, nil if none.
func (e *liveDevice) col(name unique.Handle[string]) *liveCol {
	for i := range e.cols {
		if e.cols[i].name == name {
			return &e.cols[i]
		}
	}
	return nil
}

// trim lets go of what is older than cut.
func (e *liveDevice) trim(cut buckets.Ticks) {
	if cut <= e.from {
		return
	}
	e.from = cut
	i, _ := slices.BinarySearch(e.ticks, cut)
	e.ticks = e.ticks[i:]
	e.n -= i
	for i := range e.cols {
		c := &e.cols[i]
		j, _ := slices.BinarySearch(c.k, cut)
		c.k, c.s = c.k[j:], c.s[j:]
		e.n -= j
	}
	e.cols = slices.DeleteFunc(e.cols, func(c liveCol) bool { return len(c.k) == 0 })
	e.syncNewest()
}

// slice is the samples of name, one per millisecond: the newest of the
// readings that share one. They start at or before from (a whole
// millisecond) when the device is held from then, and may go on past
// to (a whole millisecond too; the newest are not looked at, so that a
// select touches a device's samples only when it iterates them): the
// caller keeps those it wants, scanning back from the newest.
func (e *liveDevice) slice(name unique.Handle[string], from, to buckets.Ticks) []sample {
	c := e.col(name)
	if c == nil {
		return nil
	}
	if !c.dup {
		return slices.Clip(c.s)
	}
	toMs := msOf(to)
	hi := len(c.s)
	for hi > 0 && c.s[hi-1].t >= toMs {
		hi--
	}
	lo, _ := slices.BinarySearch(c.k, from)
	hi = max(hi, lo)
	return perMillisecond(c.k[lo:hi], valuesOf(c.s[lo:hi]))
}

func valuesOf(s []sample) []float64 {
	out := make([]float64, len(s))
	for i, x := range s {
		out[i] = x.f
	}
	return out
}
