package promapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unique"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/telemetryd/telemetryd/buckets"
)

// Source is what the query API needs from the store.
type Source interface {
	// Devices lists at most q.Limit devices that q selects (prefix,
	// attribute matchers, visibility), sorted by ID, with their first
	// and last seen times, latest values and attributes; more is true
	// when more remain.
	Devices(ctx context.Context, q buckets.DeviceQuery) (devs []buckets.DeviceInfo, more bool, err error)
	// Range returns one page of a device's readings.
	Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error)
}

// AttributeIndex is the store's index of attribute names and values.
// When Config.Source also implements it, /api/v1/labels and the values
// of an attribute label are answered from it instead of from every
// matching device.
type AttributeIndex interface {
	// AttributeNames returns the sorted attribute names of the devices
	// q selects (Prefix, Match, Visible).
	AttributeNames(ctx context.Context, q buckets.DeviceQuery) ([]string, error)
	// AttributeValues returns the sorted values of the attribute name
	// among the devices q selects.
	AttributeValues(ctx context.Context, name string, q buckets.DeviceQuery) ([]string, error)
}

// Label names of every series.
const (
	labelDevice = "device"
)

// unixEpoch is 1970-01-01T00:00:00Z in ticks.
var unixEpoch = buckets.MustTicks(time.Unix(0, 0))

// Millisecond timestamps of the representable range.
var (
	minMillis = msOf(0)
	maxMillis = msOf(buckets.MaxTicks)
)

// msOf converts ticks to Unix milliseconds, rounding down.
func msOf(k buckets.Ticks) int64 {
	d := int64(k - unixEpoch)
	ms := d / 10000
	if d%10000 < 0 {
		ms--
	}
	return ms
}

// ticksOf converts Unix milliseconds to ticks, clamped to the
// representable range.
func ticksOf(ms int64) buckets.Ticks {
	switch {
	case ms <= minMillis:
		return 0
	case ms >= maxMillis:
		return buckets.MaxTicks
	}
	return unixEpoch + buckets.Ticks(ms)*10000
}

// queryable implements storage.Queryable over a Source. Each numeric
// value name of a device is the series {__name__=<name>, device=<id>,
// <attributes>}; every device seen has the series LastSeenName too.
type queryable struct {
	src        Source
	visible    func(ctx context.Context) func(buckets.DeviceID) bool
	retention  time.Duration // 0: devices never expire from LastSeenName
	lookback   int64         // the engine's lookback delta, ms
	maxSeries  int
	maxSamples int
	pageSize   int
	// noPushdown makes every select read raw readings (for tests that
	// compare both ways).
	noPushdown bool
	// shape is the shape of the one query this copy serves; nil when
	// unknown.
	shape *queryShape
	// recent is the cache of recent reads the queries of SharedReads
	// batches use; nil: none.
	recent *recentReads
	// live holds the recent samples of the devices the batches read,
	// following the store's commits; nil when the source does not tell
	// of them (watchable).
	live *liveWindow
}

var _ storage.Queryable = (*queryable)(nil)

// Querier implements storage.Queryable.
func (q *queryable) Querier(mint, maxt int64) (storage.Querier, error) {
	qr := &querier{q: q, mint: mint, maxt: maxt}
	if r, ok := q.src.(SampleReader); ok && !q.noPushdown {
		qr.samples = newSampleCache(r)
	}
	return qr, nil
}

// querier answers selects for [mint, maxt] (milliseconds, inclusive).
type querier struct {
	q          *queryable
	mint, maxt int64
	samples    *sampleCache // nil: series are read page by page with Range
	windows    *windowCache // the pushed-down selects' summaries; made by the first such select
	pooled     []*seriesSet // the shared selects' sets, given back by Close
}

// errTooManySeries is returned when a selector matches more series than
// Config.MaxSeries.
var errTooManySeries = errors.New("too many series")

// seriesRef is one series before its samples are read.
type seriesRef struct {
	lset labels.Labels
	dev  buckets.DeviceID
	name string
	// lastSeen is the device's last reading time, as listed.
	lastSeen buckets.Ticks
	// seen is set for the device's LastSeenName series: its first and
	// last reading times from the index.
	seen    seenBounds
	hasSeen bool
	// live is set when buf, or newest when hasNewest is set, holds the
	// series' samples of the select, taken from the live window as the
	// series was matched.
	live      bool
	buf       []sample
	newest    sample
	hasNewest bool
}

// matchLive is what a select takes from the live window as it matches
// series (querier.match).
type matchLive uint8

const (
	notLive    matchLive = iota
	liveSpan             // the samples of the select's span
	liveNewest           // the newest sample in the span only (an instant selector)
)

// seenBounds are a device's first and last reading times.
type seenBounds struct{ first, last buckets.Ticks }

// match resolves matchers to series whose device was seen in [mint,
// maxt]: device matchers choose which devices are listed at all (an
// equality or a regex of alternatives looks devices up one by one, a
// regex with a literal prefix lists only that prefix), attribute
// matchers are answered by the store's index, __name__ matchers choose
// among each device's value names and LastSeenName.
//
// With live set (a shared select of a batch), the series of a device the
// live window holds take their labels and samples from it as they are
// matched.
//
// With filter set (an instant query's only selector, KeepValues), a
// series whose value is known as it is matched and that filter rejects
// is left out; it still counts towards the bound on series.
func (qr *querier) match(ctx context.Context, mint, maxt int64, ms []*labels.Matcher, live matchLive, filter *sampleFilter) ([]seriesRef, error) {
	devMs, nameMs, attrMs, none := splitMatchers(ms)
	if none {
		return nil, nil
	}
	from, to := ticksOf(mint), ticksOf(maxt)
	var recent *recentReads
	b := batchOf(ctx)
	if b != nil {
		recent = qr.q.recent
	}
	lsetOf := seriesLabels
	if recent != nil {
		lsetOf = recent.seriesLabels
	}
	var lw *liveWindow
	if live != notLive && recent != nil {
		lw = qr.q.live
	}
	// The handles of the value names the live window is looked up by:
	// a select mostly matches one name.
	var lastName string
	var lastHandle unique.Handle[string]
	handleOf := func(name string) unique.Handle[string] {
		if name != lastName || lastHandle == (unique.Handle[string]{}) {
			lastName, lastHandle = name, unique.Make(name)
		}
		return lastHandle
	}
	var out []seriesRef
	if live != notLive {
		if p, _ := refPool.Get().(*[]seriesRef); p != nil {
			out = (*p)[:0]
		}
	}
	matched := 0
	count := func() error {
		if matched >= qr.q.maxSeries {
			return fmt.Errorf("%w: the selector matches more than %d series; narrow it", errTooManySeries, qr.q.maxSeries)
		}
		matched++
		return nil
	}
	// ordered stays set while the series come in the order of their
	// labels: one name, devices ascending, and no attribute name sorting
	// before "device" (the labels then compare by the device first).
	ordered := true
	add := func(ref seriesRef, d *buckets.DeviceInfo) error {
		if err := count(); err != nil {
			return err
		}
		if len(out) == cap(out) { // doubles: the default growth copies large sets many times
			out = slices.Grow(out, max(len(out), 64))
		}
		if ordered && len(out) > 0 {
			p := &out[len(out)-1]
			ordered = p.name == ref.name && p.dev < ref.dev
		}
		ordered = ordered && (len(d.Attributes) == 0 || d.Attributes[0].Name > labelDevice)
		out = append(out, ref)
		return nil
	}
	err := qr.q.devices(ctx, devMs, attrMs, func(l *deviceList, i int) error {
		d := &l.devs[i]
		var e *liveDevice
		if lw != nil {
			lw.mu.Lock()
			defer lw.mu.Unlock()
			if e = l.liveAt(lw, i); e != nil && (!e.ready || e.from > from) {
				e = nil
			}
		}
		lsetOf := func(name string) labels.Labels {
			if e == nil {
				return lsetOf(name, d)
			}
			return lw.labelsOf(e, handleOf(name), d)
		}
		if qr.q.lastSeenIn(d, from, to) && matchAll(nameMs, LastSeenName) {
			if v, known := filter.lastSeenValue(d); known && !filter.keeps(v) {
				if err := count(); err != nil {
					return err
				}
			} else {
				r := seriesRef{lset: lsetOf(LastSeenName), dev: d.Device, name: LastSeenName,
					seen: seenBounds{first: d.FirstSeen, last: d.LastSeen}, hasSeen: true}
				if err := add(r, d); err != nil {
					return err
				}
			}
		}
		if d.LastSeen < from || d.FirstSeen > to {
			return nil
		}
		if recent != nil && e == nil {
			recent.addNames(d)
		}
		for _, f := range d.Latest {
			if _, ok := buckets.Numeric(f.Value); !ok || f.Name == LastSeenName || !matchAll(nameMs, f.Name) {
				continue
			}
			r := seriesRef{dev: d.Device, name: f.Name, lastSeen: d.LastSeen}
			if e != nil {
				h := handleOf(f.Name)
				if n, ok := e.newestOf(h); live == liveNewest && ok && n.t >= mint && n.t <= maxt {
					r.live, r.newest, r.hasNewest = true, n, true
				} else {
					r.live, r.buf = true, e.slice(h, from, to+10000)
				}
			}
			if filter != nil && r.hasNewest && !filter.keeps(r.newest.f) {
				if err := count(); err != nil {
					return err
				}
				continue
			}
			r.lset = lsetOf(f.Name)
			if err := add(r, d); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !ordered {
		slices.SortFunc(out, func(a, b seriesRef) int { return labels.Compare(a.lset, b.lset) })
	}
	return out, nil
}

// splitMatchers sorts matchers by what they select: the device ID, the
// value name, or attributes. none is true when no series can match (a
// matcher on a label that cannot be an attribute, and that the empty
// string does not satisfy).
func splitMatchers(ms []*labels.Matcher) (devMs, nameMs, attrMs []*labels.Matcher, none bool) {
	for _, m := range ms {
		switch {
		case m.Name == model.MetricNameLabel:
			nameMs = append(nameMs, m)
		case m.Name == labelDevice:
			devMs = append(devMs, m)
		case buckets.ValidateAttributeName(m.Name) == nil:
			attrMs = append(attrMs, m)
		case !m.Matches(""): // a label no series has
			return nil, nil, nil, true
		}
	}
	return devMs, nameMs, attrMs, false
}

// seriesLabels are the labels of value name of device d: the name, the
// device and its attributes.
func seriesLabels(name string, d *buckets.DeviceInfo) labels.Labels {
	b := labels.NewScratchBuilder(2 + len(d.Attributes))
	b.Add(model.MetricNameLabel, name)
	b.Add(labelDevice, string(d.Device))
	for _, a := range d.Attributes {
		b.Add(a.Name, a.Value)
	}
	b.Sort()
	return b.Labels()
}

func matchAll(ms []*labels.Matcher, v string) bool {
	for _, m := range ms {
		if !m.Matches(v) {
			return false
		}
	}
	return true
}

// devicesPage is how many devices one listing call asks for.
const devicesPage = 1000

// deviceQuery is the store query of the devices the request of ctx may
// see that satisfy the attribute matchers.
func (q *queryable) deviceQuery(ctx context.Context, attrMs []*labels.Matcher) (buckets.DeviceQuery, error) {
	dq := buckets.DeviceQuery{Match: make([]*buckets.Matcher, len(attrMs))}
	for i, m := range attrMs {
		var err error
		if dq.Match[i], err = buckets.NewMatcher(buckets.MatchType(m.Type), m.Name, m.Value); err != nil {
			return dq, err
		}
	}
	if q.visible != nil {
		dq.Visible = q.visible(ctx)
	}
	return dq, nil
}

// devices calls fn for every visible device that the device and
// attribute matchers accept, reading from the device index only the
// devices they can match: the store applies the attribute matchers and
// the visibility.
//
// fn gets the list and the index in it of each device.
func (q *queryable) devices(ctx context.Context, devMs, attrMs []*labels.Matcher, fn func(l *deviceList, i int) error) error {
	base, err := q.deviceQuery(ctx, attrMs)
	if err != nil {
		return err
	}
	visit := func(l *deviceList, i int) error {
		if !matchAll(devMs, string(l.devs[i].Device)) {
			return nil
		}
		return fn(l, i)
	}
	// Exact names: look each one up.
	for _, m := range devMs {
		var names []string
		switch {
		case m.Type == labels.MatchEqual:
			names = []string{m.Value}
		case m.Type == labels.MatchRegexp && len(m.SetMatches()) > 0:
			names = m.SetMatches()
		default:
			continue
		}
		for _, n := range names {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("look up device %s: %w", n, err)
			}
			dev := buckets.DeviceID(n)
			if dev.Validate() != nil {
				continue
			}
			dq := base
			dq.Prefix, dq.Limit = n, 1
			l, err := q.listDevices(ctx, dq)
			if err != nil {
				return fmt.Errorf("look up device %s: %w", n, err)
			}
			if len(l.devs) == 1 && l.devs[0].Device == dev {
				if err := visit(l, 0); err != nil {
					return err
				}
			}
		}
		return nil
	}
	// Otherwise list, narrowed to a literal prefix when a regex has one.
	dq := base
	for _, m := range devMs {
		if m.Type == labels.MatchRegexp && len(m.Prefix()) > len(dq.Prefix) && buckets.DeviceID(m.Prefix()).Validate() == nil {
			dq.Prefix = m.Prefix()
		}
	}
	dq.Limit = devicesPage
	for {
		if err := ctx.Err(); err != nil { // between pages: a long listing stops at its deadline
			return fmt.Errorf("list devices: %w", err)
		}
		l, err := q.listDevices(ctx, dq)
		if err != nil {
			return fmt.Errorf("list devices: %w", err)
		}
		for i := range l.devs {
			if err := visit(l, i); err != nil {
				return err
			}
		}
		if !l.more || len(l.devs) == 0 {
			return nil
		}
		dq.After = l.devs[len(l.devs)-1].Device
	}
}

// Select implements storage.Querier.
func (qr *querier) Select(ctx context.Context, _ bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	mint, maxt := qr.mint, qr.maxt
	if hints != nil {
		mint, maxt = max(mint, hints.Start), min(maxt, hints.End)
	}
	shared := batchOf(ctx) != nil && qr.samples != nil && qr.q.sharedSelect(hints, mint, maxt)
	live := notLive
	switch {
	case shared && hints.Range == 0:
		live = liveNewest
	case shared:
		live = liveSpan
	}
	seenFirst, seenStep, seenLast := qr.q.seenTimes(hints, mint, maxt)
	var filter *sampleFilter
	if f := sampleFilterOf(ctx); f != nil && live == liveNewest {
		filter = &sampleFilter{of: f.of, keep: f.keep, seenAt: seenLast, seenOne: seenFirst == seenLast, retention: qr.q.retention}
	}
	refs, err := qr.match(ctx, mint, maxt, ms, live, filter)
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	if hints != nil && hints.Func == "series" {
		mint, maxt = 0, -1 // labels only: no samples
	}
	set := &seriesSet{ctx: ctx, q: qr.q, refs: refs, i: -1, mint: mint, maxt: maxt}
	if shared {
		qr.pooled = append(qr.pooled, set)
	}
	set.seenFirst, set.seenStep, set.seenLast = seenFirst, seenStep, seenLast
	if shared {
		// Before the summaries: the recent reads cover the window.
		set.recent, set.newestOnly = true, hints.Range == 0
		return set
	}
	if agg, ok := qr.q.src.(Aggregator); ok && !qr.q.noPushdown {
		if w, ok := windowsOf(hints, qr.q.shape.inSubquery(hints)); ok {
			set.agg, set.windows = agg, &w
			if qr.windows == nil {
				qr.windows = newWindowCache(agg)
			}
			if qr.windows.addSet(refs, &w, qr.q.maxSamples) {
				set.cached = qr.windows
			}
			return set
		}
	}
	if qr.samples != nil && mint <= maxt && dense(hints, qr.q.lookback) {
		set.samples = qr.samples
		if e, ok := lastEndsOf(hints, qr.q.shape); ok {
			set.lastEnds = &e
		}
		for _, r := range refs {
			if !r.hasSeen {
				set.samples.add(set.span(r), r.name)
			}
		}
	}
	return set
}

// LabelValues implements storage.LabelQuerier. The values of an
// attribute come from the store's attribute index when the matchers
// name no value (__name__): those are the values among the visible
// devices the matchers select, whatever the time range.
func (qr *querier) LabelValues(ctx context.Context, name string, _ *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	if idx, dq, ok := qr.fromIndex(ctx, ms); ok && name != model.MetricNameLabel && name != labelDevice {
		if buckets.ValidateAttributeName(name) != nil {
			return nil, nil, nil
		}
		vals, err := idx.AttributeValues(ctx, name, dq)
		return vals, nil, err
	}
	refs, err := qr.match(ctx, qr.mint, qr.maxt, ms, notLive, nil)
	if err != nil {
		return nil, nil, err
	}
	var vals []string
	for _, r := range refs {
		if v := r.lset.Get(name); v != "" {
			vals = append(vals, v)
		}
	}
	slices.Sort(vals)
	return slices.Compact(vals), nil, nil
}

// fromIndex reports whether label names and attribute values for ms
// can be answered from the attribute index (the source has one, and ms
// has no __name__ matcher), and with which device query.
func (qr *querier) fromIndex(ctx context.Context, ms []*labels.Matcher) (AttributeIndex, buckets.DeviceQuery, bool) {
	idx, ok := qr.q.src.(AttributeIndex)
	if !ok {
		return nil, buckets.DeviceQuery{}, false
	}
	devMs, nameMs, attrMs, none := splitMatchers(ms)
	if len(nameMs) > 0 || none {
		return nil, buckets.DeviceQuery{}, false
	}
	// The store matches "device" against the device ID.
	dq, err := qr.q.deviceQuery(ctx, append(slices.Clone(attrMs), devMs...))
	return idx, dq, err == nil
}

// LabelNames implements storage.LabelQuerier: __name__ and device when
// a series matches, and the attribute names of the matching devices.
func (qr *querier) LabelNames(ctx context.Context, _ *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	if idx, dq, ok := qr.fromIndex(ctx, ms); ok {
		dq.Limit = 1
		devs, _, err := qr.q.src.Devices(ctx, dq)
		if err != nil || len(devs) == 0 {
			return []string{}, nil, err
		}
		dq.Limit = 0
		names, err := idx.AttributeNames(ctx, dq)
		if err != nil {
			return nil, nil, err
		}
		return sortedUnique(append(names, model.MetricNameLabel, labelDevice)), nil, nil
	}
	refs, err := qr.match(ctx, qr.mint, qr.maxt, ms, notLive, nil)
	if err != nil || len(refs) == 0 {
		return []string{}, nil, err
	}
	var names []string
	for _, r := range refs {
		r.lset.Range(func(l labels.Label) { names = append(names, l.Name) })
	}
	return sortedUnique(names), nil, nil
}

// Close implements storage.Querier: it waits for the reads ahead, and
// gives the shared selects' series back for later selects to use.
func (qr *querier) Close() error {
	if qr.samples != nil {
		qr.samples.wait()
	}
	for _, set := range qr.pooled {
		// Only what was used is cleared: the rest was cleared when it
		// was given back before, or never used.
		clear(set.refs)
		clear(set.all)
		refs, all := set.refs[:cap(set.refs)], set.all[:cap(set.all)]
		refPool.Put(&refs)
		if all != nil {
			seriesPool.Put(&all)
		}
	}
	qr.pooled = nil
	return nil
}

// refPool and seriesPool hold the series of shared selects whose query
// ended (querier.Close), so that the next one does not allocate them:
// a batch selects every device for each of its rules.
var refPool, seriesPool sync.Pool

// seriesSet walks the matched series; samples are read only when the
// engine iterates a series.
type seriesSet struct {
	ctx        context.Context
	q          *queryable
	refs       []seriesRef
	all        []series // made by At
	i          int
	mint, maxt int64
	agg        Aggregator
	windows    *windows     // set: answer per window from summaries
	cached     *windowCache // set: the windows are read with the querier's other selects
	samples    *sampleCache // set: samples come from the querier's projected reads
	lastEnds   *lastEnds    // set with samples: only those last_over_time looks at (thinLast)
	recent     bool         // samples come from the recent reads (SharedReads)
	newestOnly bool         // with recent: only the newest sample is wanted
	// the sample times of LastSeenName series (seenTimes)
	seenFirst, seenStep, seenLast int64
}

func (s *seriesSet) Next() bool {
	s.i++
	return s.i < len(s.refs)
}

func (s *seriesSet) At() storage.Series {
	if s.all == nil { // one allocation for the set's series
		if p, _ := seriesPool.Get().(*[]series); p != nil && cap(*p) >= len(s.refs) {
			s.all = (*p)[:len(s.refs)]
		} else {
			s.all = make([]series, len(s.refs))
		}
	}
	x := &s.all[s.i]
	*x = series{set: s, ref: s.refs[s.i], i: s.i}
	return x
}

func (s *seriesSet) Err() error                        { return nil }
func (s *seriesSet) Warnings() annotations.Annotations { return nil }

// series is one value name of one device.
type series struct {
	set *seriesSet
	ref seriesRef
	i   int
}

func (s *series) Labels() labels.Labels { return s.ref.lset }

func (s *series) Iterator(prev chunkenc.Iterator) chunkenc.Iterator {
	if s.ref.hasSeen {
		last := s.set.seenLast
		if s.set.maxt < s.set.mint {
			last = s.set.seenFirst - 1 // labels only
		}
		it, ok := prev.(seenSeekIter[int64])
		if !ok || it.seenIter == nil { // else the engine's previous iterator is used again
			it = seenSeekIter[int64]{new(seenIter)}
		}
		*it.seenIter = seenIter{ctx: s.set.ctx, q: s.set.q, dev: s.ref.dev, seen: s.ref.seen,
			first: s.set.seenFirst, step: s.set.seenStep, last: last, loadedSamples: loadedSamples{buf: it.buf[:0]}}
		return it
	}
	if s.set.recent {
		return s.set.sharedIter(s.ref, prev)
	}
	if s.set.windows != nil {
		it := s.set.newWindowIter(s.ref)
		if s.set.cached != nil {
			it.buf, it.err = s.set.cached.take(s.set.ctx, keyOf(s.ref.dev, s.set.windows), s.ref.name)
			it.read, it.i = true, -1
		}
		return windowSeekIter[int64]{it}
	}
	if s.set.samples != nil && s.set.lastEnds != nil {
		return thinnedIter(s.set.ctx, s.set.samples, s.set.span(s.ref), s.ref.name, *s.set.lastEnds)
	}
	if s.set.samples != nil {
		return loadedIter(s.set.ctx, s.set.samples, s.set.span(s.ref), s.ref.name)
	}
	sp := s.set.span(s.ref)
	return seekingIter[int64]{&sampleIter{ctx: s.set.ctx, q: s.set.q, dev: s.ref.dev, name: s.ref.name,
		from: sp.from, to: sp.to, i: -1}}
}

// span is the device of ref and the ticks of the set's samples.
func (s *seriesSet) span(ref seriesRef) sampleSpan {
	return sampleSpan{dev: ref.dev, from: ticksOf(s.mint), to: ticksOf(s.maxt) + 10000}
}

// sample is one point of a series.
type sample struct {
	t int64
	f float64
}

// loadedSamples is the position of an iterator over samples it loads
// whole on first use (the last-seen series, pushed-down windows): the
// loader fills buf or sets err and read. It gives such iterators their
// Next, Seek and At methods.
type loadedSamples struct {
	read bool
	buf  []sample
	i    int
	err  error
}

func (s *loadedSamples) next(load func()) chunkenc.ValueType {
	if !s.read {
		load()
		s.i = -1
	}
	if s.err != nil || s.i+1 >= len(s.buf) {
		s.i = len(s.buf)
		return chunkenc.ValNone
	}
	s.i++
	return chunkenc.ValFloat
}

func (s *loadedSamples) seek(t int64, load func()) chunkenc.ValueType {
	if !s.read {
		load()
		s.i = -1
	}
	if s.err != nil {
		return chunkenc.ValNone
	}
	s.i = max(s.i, 0)
	for s.i < len(s.buf) && s.buf[s.i].t < t {
		s.i++
	}
	if s.i >= len(s.buf) {
		return chunkenc.ValNone
	}
	return chunkenc.ValFloat
}

func (s *loadedSamples) At() (int64, float64) { x := s.buf[s.i]; return x.t, x.f }

func (s *loadedSamples) AtHistogram(*histogram.Histogram) (int64, *histogram.Histogram) {
	return s.buf[s.i].t, nil
}

func (s *loadedSamples) AtFloatHistogram(*histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	return s.buf[s.i].t, nil
}

func (s *loadedSamples) AtT() int64  { return s.buf[s.i].t }
func (s *loadedSamples) AtST() int64 { return 0 }
func (s *loadedSamples) Err() error  { return s.err }

// sampleIter reads a series from the store page by page, oldest first.
// A series has one sample per millisecond: readings less than a
// millisecond apart share it, and the newest of them is the sample
// (the engine's behaviour with equal timestamps is not defined). A Seek past the loaded page starts reading at
// the sought time, so sparse steps skip what they do not need.
type sampleIter struct {
	ctx      context.Context
	q        *queryable
	dev      buckets.DeviceID
	name     string
	from, to buckets.Ticks // the next page starts at from
	after    *buckets.Ticks
	done     bool
	buf      []sample
	held     *sample // the last sample of a page, until the next page
	i        int
	err      error
	one      [1]sample // buf of a series of one sample (seriesRef.newest)
}

// fill loads the next page that has samples; false at the end.
func (it *sampleIter) fill() bool {
	for !it.done && it.err == nil {
		if it.from >= it.to {
			it.done = true
			break
		}
		if err := it.ctx.Err(); err != nil { // between pages: a long series stops at its deadline
			it.err = fmt.Errorf("read %s of %s: %w", it.name, it.dev, err)
			break
		}
		page, err := it.q.src.Range(it.ctx, buckets.RangeQuery{Device: it.dev, From: it.from, To: it.to,
			Order: buckets.Asc, Limit: it.q.pageSize, After: it.after})
		if err != nil {
			it.err = fmt.Errorf("read %s of %s: %w", it.name, it.dev, err)
			break
		}
		it.buf, it.i = it.buf[:0], 0
		if it.held != nil {
			it.buf, it.held = append(it.buf, *it.held), nil
		}
		for i := range page.Readings {
			r := &page.Readings[i]
			v, ok := r.Get(it.name)
			if !ok {
				continue
			}
			f, ok := buckets.Numeric(v)
			if !ok {
				continue
			}
			t := msOf(r.Ticks)
			if n := len(it.buf); n > 0 && it.buf[n-1].t == t {
				it.buf[n-1].f = f
				continue
			}
			it.buf = append(it.buf, sample{t, f})
		}
		if !page.More || len(page.Readings) == 0 {
			it.done = true
		} else {
			last := page.Readings[len(page.Readings)-1].Ticks
			it.after = &last
			// The next page may hold newer readings of the millisecond
			// of the page's last reading: its sample waits for them.
			if n := len(it.buf); n > 0 && it.buf[n-1].t == msOf(last) {
				held := it.buf[n-1]
				it.buf, it.held = it.buf[:n-1], &held
			}
		}
		if len(it.buf) > 0 {
			return true
		}
	}
	it.buf, it.i = it.buf[:0], 0
	return false
}

func (it *sampleIter) Next() chunkenc.ValueType {
	if it.i+1 < len(it.buf) { // i is -1 before the first sample of samples already loaded
		it.i++
		return chunkenc.ValFloat
	}
	if it.fill() {
		return chunkenc.ValFloat
	}
	return chunkenc.ValNone
}

// seekingIter adds Seek to a sampleIter. Its parameter is a type
// parameter only because go vet's stdmethods check expects every
// method named Seek to be io.Seeker's; instantiated with int64 it is
// chunkenc.Iterator's Seek.
type seekingIter[T ~int64] struct{ *sampleIter }

// Seek implements chunkenc.Iterator.
func (it seekingIter[T]) Seek(t T) chunkenc.ValueType { return it.seek(int64(t)) }

var _ chunkenc.Iterator = seekingIter[int64]{}

// seek advances to the first sample at or after t.
func (it *sampleIter) seek(t int64) chunkenc.ValueType {
	if it.i >= 0 && it.i < len(it.buf) && it.buf[it.i].t >= t {
		return chunkenc.ValFloat
	}
	if n := len(it.buf); n > 0 && it.buf[n-1].t >= t {
		it.i = max(it.i, 0)
		it.i += slices.IndexFunc(it.buf[it.i:], func(s sample) bool { return s.t >= t })
		return chunkenc.ValFloat
	}
	// Past the loaded page: start the next read at t.
	if k := ticksOf(t); !it.done && k > it.from {
		it.from, it.after = k, nil
	}
	it.buf, it.i = it.buf[:0], 0
	for it.fill() {
		if j := slices.IndexFunc(it.buf, func(s sample) bool { return s.t >= t }); j >= 0 {
			it.i = j
			return chunkenc.ValFloat
		}
	}
	return chunkenc.ValNone
}

func (it *sampleIter) At() (int64, float64) { s := it.buf[it.i]; return s.t, s.f }

func (it *sampleIter) AtHistogram(*histogram.Histogram) (int64, *histogram.Histogram) {
	return it.buf[it.i].t, nil
}

func (it *sampleIter) AtFloatHistogram(*histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	return it.buf[it.i].t, nil
}

func (it *sampleIter) AtT() int64  { return it.buf[it.i].t }
func (it *sampleIter) AtST() int64 { return 0 }
func (it *sampleIter) Err() error  { return it.err }
