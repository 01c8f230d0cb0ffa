package promapi

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unique"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/telemetryd/telemetryd/buckets"
)

// SharedReads returns ctx marked as one batch of queries evaluated at
// one time, as the rules of one group are (Instant). The queries of a
// batch list each page of devices once, and read each device's recent
// samples through the API's cache of recent reads (recentReads), every
// numeric value name of the device together, however many of them
// select the device.
//
// A select uses the cache when its query is instant and its span is no
// longer than the lookback delta (a plain selector, or a range function
// over at most the lookback delta, outside subqueries).
func SharedReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, batchKey{}, &batch{lists: map[string]*deviceList{}})
}

type batchKey struct{}

func batchOf(ctx context.Context) *batch {
	b, _ := ctx.Value(batchKey{}).(*batch)
	return b
}

// Bounds of what the shared reads keep.
const (
	// recentMaxSamples bounds the samples the cache of recent reads
	// holds (16 bytes each); past it, it starts over empty.
	recentMaxSamples = 2 << 20
	// recentMaxNames bounds the value names read together.
	recentMaxNames = buckets.MaxValues
	// recentMaxAge is how far the evaluation time may move past a read
	// before the read is no longer used: a reading that arrives late,
	// with a time before the device's newest, is seen by then.
	recentMaxAge = buckets.Ticks(60 * 10_000_000)
	// recentMargin is how much more than the lookback delta a read
	// covers, so that a group evaluated at a time a little before the
	// last read's (its evaluation was delayed) is answered from it too.
	recentMargin = 30_000 // ms
	// batchMaxDevices bounds the device list entries a batch keeps.
	batchMaxDevices = 100_000
	// recentMaxLabels bounds the series labels kept; past it, the
	// cache starts over empty.
	recentMaxLabels = 1 << 18
)

// batch is what the queries of one SharedReads context share.
type batch struct {
	mu      sync.Mutex
	lists   map[string]*deviceList
	devices int // devices held in lists
}

// deviceList is one answer of Source.Devices.
type deviceList struct {
	devs []buckets.DeviceInfo
	more bool
	// live is the live window's entry of each device (nil: none), looked
	// up once for the selects of a batch; valid while the window's
	// epoch is liveEpoch. Guarded by the window's mu.
	live      []*liveDevice
	liveOf    *liveWindow
	liveEpoch uint64
}

// liveAt is w's entry of l.devs[i], nil if none; w.mu is held.
func (l *deviceList) liveAt(w *liveWindow, i int) *liveDevice {
	if l.liveOf != w || l.liveEpoch != w.epoch || len(l.live) != len(l.devs) {
		if cap(l.live) < len(l.devs) {
			l.live = make([]*liveDevice, len(l.devs))
		}
		l.live = l.live[:len(l.devs)]
		for j := range l.devs {
			l.live[j] = w.devs[l.devs[j].Device]
		}
		l.liveOf, l.liveEpoch = w, w.epoch
	}
	return l.live[i]
}

// recentReads keeps, per device, the samples of its last shared read:
// every value name the batches have selected, over the lookback delta
// and recentMargin before the evaluation time of the read. A later
// select of the device is answered from it while the device's last-seen time (from the
// device index, listed by that select) is the one it had at the read
// and older than the read's end: the device has sent nothing newer
// since. Devices that send every interval are so read once per
// interval however many groups select them; the others once.
type recentReads struct {
	mu      sync.Mutex
	names   []string // sorted: the names read together
	devs    map[buckets.DeviceID]*recentRead
	samples int

	// labels are the labels of the series the batches selected, kept
	// with the attributes they were made of.
	lmu    sync.Mutex
	labels map[labelsKey]madeLabels
}

type labelsKey struct {
	dev  buckets.DeviceID
	name string
}

type madeLabels struct {
	attrs buckets.Attributes
	lset  labels.Labels
}

// seriesLabels is seriesLabels(name, d), made again only when d's
// attributes changed since it was last made.
func (r *recentReads) seriesLabels(name string, d *buckets.DeviceInfo) labels.Labels {
	k := labelsKey{d.Device, name}
	r.lmu.Lock()
	m, ok := r.labels[k]
	r.lmu.Unlock()
	if ok && slices.Equal(m.attrs, d.Attributes) {
		return m.lset
	}
	l := seriesLabels(name, d)
	r.lmu.Lock()
	if len(r.labels) >= recentMaxLabels {
		clear(r.labels)
	}
	r.labels[k] = madeLabels{attrs: d.Attributes, lset: l}
	r.lmu.Unlock()
	return l
}

// recentRead is one device's read: the names read and their samples
// over [from, to), and the device's last-seen time when it was read.
type recentRead struct {
	from, to buckets.Ticks
	lastSeen buckets.Ticks
	names    []string
	got      [][]sample // per name
	n        int
}

func newRecentReads() *recentReads {
	return &recentReads{devs: map[buckets.DeviceID]*recentRead{}, labels: map[labelsKey]madeLabels{}}
}

// addNames records the numeric value names of d, so that a device is
// read with every name the batches may select of it.
func (r *recentReads) addNames(d *buckets.DeviceInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range d.Latest {
		if _, ok := buckets.Numeric(f.Value); ok && f.Name != LastSeenName {
			r.addName(f.Name)
		}
	}
}

// addName adds name to the names read together; r.mu is held.
func (r *recentReads) addName(name string) {
	i, ok := slices.BinarySearch(r.names, name)
	if !ok && len(r.names) < recentMaxNames {
		r.names = slices.Insert(slices.Clip(r.names), i, name)
	}
}

// usable reports whether e answers a select of [want.from, want.to) of
// a device last seen at lastSeen: the device has sent nothing since
// the read (its last-seen time is unchanged), and for a select past
// the read's end, the read held its newest reading.
func (e *recentRead) usable(want sampleSpan, lastSeen buckets.Ticks) bool {
	if e.from > want.from || want.to-e.to > recentMaxAge {
		return false
	}
	return lastSeen == e.lastSeen && (want.to <= e.to || lastSeen < e.to)
}

func (e *recentRead) of(name string) ([]sample, bool) {
	for i, n := range e.names {
		if n == name {
			return e.got[i], true
		}
	}
	return nil, false
}

// take returns the samples of name of sp.dev over sp, from the device's
// last read when it is usable, else read now with every recorded name.
// The slice is shared: the caller must not modify it.
func (r *recentReads) take(ctx context.Context, src SampleReader, sp sampleSpan, lastSeen buckets.Ticks, name string) ([]sample, error) {
	r.mu.Lock()
	if e := r.devs[sp.dev]; e != nil && e.usable(sp, lastSeen) {
		if s, ok := e.of(name); ok {
			r.mu.Unlock()
			return s, nil
		}
	}
	r.addName(name)
	names := r.names
	r.mu.Unlock()
	if _, ok := slices.BinarySearch(names, name); !ok {
		names = []string{name} // past recentMaxNames
	}
	e := &recentRead{from: sp.from, to: sp.to, lastSeen: lastSeen, names: names, got: make([][]sample, len(names))}
	err := src.Samples(ctx, sp.dev, sp.from, sp.to, names, func(n string, ticks []buckets.Ticks, vals []float64) {
		if i, ok := slices.BinarySearch(names, n); ok {
			e.got[i] = perMillisecond(ticks, vals)
			e.n += len(e.got[i])
		}
	})
	if err != nil {
		return nil, err
	}
	out, _ := e.of(name)
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.devs[sp.dev]
	if old != nil && old.to > e.to {
		return out, nil // an older span (offset): the newer read stays
	}
	if old != nil {
		r.samples -= old.n + 1
	}
	if r.samples+e.n+1 > recentMaxSamples {
		clear(r.devs)
		r.samples = 0
	}
	r.devs[sp.dev] = e
	r.samples += e.n + 1
	return out, nil
}

// listKey identifies a device query without Visible.
func listKey(q buckets.DeviceQuery) string {
	var b strings.Builder
	b.WriteString(q.Prefix)
	b.WriteByte(0)
	b.WriteString(string(q.After))
	b.WriteByte(0)
	b.WriteString(strconv.Itoa(q.Limit))
	b.WriteByte(0)
	b.WriteString(strconv.FormatInt(int64(q.SilentBefore), 10))
	for _, m := range q.Match {
		b.WriteByte(0)
		b.WriteString(m.String())
	}
	return b.String()
}

// listDevices is q.src.Devices, answered from the batch of ctx when one
// of its queries listed the same page. Queries with a device filter
// (Visible) are not shared.
func (q *queryable) listDevices(ctx context.Context, dq buckets.DeviceQuery) (*deviceList, error) {
	b := batchOf(ctx)
	if b == nil || dq.Visible != nil {
		devs, more, err := q.src.Devices(ctx, dq)
		return &deviceList{devs: devs, more: more}, err
	}
	key := listKey(dq)
	b.mu.Lock()
	l, ok := b.lists[key]
	b.mu.Unlock()
	if ok {
		return l, nil
	}
	devs, more, err := q.src.Devices(ctx, dq)
	if err != nil {
		return nil, err
	}
	l = &deviceList{devs: devs, more: more}
	b.mu.Lock()
	if b.devices+len(devs) <= batchMaxDevices {
		b.lists[key] = l
		b.devices += len(devs)
	}
	b.mu.Unlock()
	return l, nil
}

// sharedSelect reports whether a select over [mint, maxt] with hints
// is answered from the recent reads: an instant query's select no
// longer than the lookback delta, outside subqueries.
func (q *queryable) sharedSelect(h *storage.SelectHints, mint, maxt int64) bool {
	return q.recent != nil && h != nil && h.Step == 0 && h.Func != "series" && mint <= maxt &&
		maxt-mint <= q.lookback && !q.shape.inSubquery(h)
}

// sharedIter iterates the samples of ref in [s.mint, s.maxt] from the
// recent reads, which read [maxt - lookback - recentMargin, maxt] when
// they read. A
// plain selector (no range) gets only the newest: an instant query
// uses no other.
//
// prev is the engine's iterator to use again, when it is one of these.
func (s *seriesSet) sharedIter(ref seriesRef, prev chunkenc.Iterator) seekingIter[int64] {
	it, ok := prev.(seekingIter[int64])
	if !ok || it.sampleIter == nil { // the engine's previous iterator is used again: none allocated per series
		it = seekingIter[int64]{new(sampleIter)}
	}
	if ref.hasNewest { // the newest sample, taken as the series was matched
		*it.sampleIter = sampleIter{ctx: s.ctx, dev: ref.dev, name: ref.name, done: true, i: -1, one: [1]sample{ref.newest}}
		it.buf = it.one[:]
		return it
	}
	buf, ok := ref.buf, ref.live
	var err error
	if !ok && s.q.live != nil {
		buf, ok, err = s.q.live.take(s.ctx, s.q.src, ref.dev, ticksOf(s.mint), ticksOf(s.maxt)+10000, unique.Make(ref.name))
	}
	if !ok && err == nil {
		sp := sampleSpan{dev: ref.dev, from: ticksOf(s.maxt - s.q.lookback - recentMargin), to: ticksOf(s.maxt) + 10000}
		buf, err = s.q.recent.take(s.ctx, s.q.src.(SampleReader), sp, ref.lastSeen, ref.name)
	}
	// A few samples, mostly all wanted: scan from the newest.
	hi := len(buf)
	for hi > 0 && buf[hi-1].t > s.maxt {
		hi--
	}
	lo := hi
	for lo > 0 && buf[lo-1].t >= s.mint && (!s.newestOnly || lo == hi) {
		lo--
	}
	buf = buf[lo:hi:hi]
	*it.sampleIter = sampleIter{ctx: s.ctx, dev: ref.dev, name: ref.name, done: true, buf: buf, i: -1, err: err}
	return it
}
