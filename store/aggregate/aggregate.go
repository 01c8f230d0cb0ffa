package aggregate

import (
	"bytes"
	"cmp"
	"slices"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
	"github.com/telemetryd/telemetryd/store/colcache"
)

// unixEpoch is 1970-01-01T00:00:00Z in ticks: buckets are aligned to
// multiples of their width since then.
var unixEpoch = buckets.MustTicks(time.Unix(0, 0))

// ticksPerMs is the ticks of one millisecond; the Unix epoch is a
// multiple of it, so k / ticksPerMs numbers the milliseconds.
const ticksPerMs = buckets.TicksPerSecond / 1000

// MaxBucketsHint bounds the buckets an aggregator makes room for
// before it sees them.
const MaxBucketsHint = 4096

// slabSize is the most summaries an aggregator allocates at
// once for its buckets; it starts with fewer when it expects few
// buckets.
const slabSize = 256

// Aggregator accumulates the buckets of one query.
type Aggregator struct {
	q         buckets.AggregateQuery
	fields    map[string]bool       // nil: every name
	buckets   map[buckets.Ticks]int // bucket start -> index in bs, for buckets outside slots
	base      buckets.Ticks         // the start of the bucket of slots[0]
	slots     []int32               // per bucket from base on: 1 + its index in bs, 0: none yet
	bs        []aggBucket
	slab      []buckets.NamedSummary      // room for the summaries of new buckets
	width     int                         // the most names a bucket has held
	slabSize  int                         // the size of the next slab
	headers   int                         // blocks summarised from their header (for tests)
	columns   int                         // blocks read column by column
	decoded   int                         // blocks decoded into readings
	maxStart  buckets.Ticks               // the latest bucket start seen
	names     map[string]string           // interned value names
	scan      *block.Scanner              // from scanners on first use, for every block read column by column
	cols      *colcache.Cache[*BlockList] // decoded columns and block lists; nil: none
	wanted    [][]byte                    // the names of q.Fields, distinct and sorted (the names a column read keeps)
	key       []byte                      // buffer of column cache keys
	pending   []pendingColumn             // columns of the block being read, cached once it is read whole
	cached    []*colcache.Column          // cached columns being added: per block, in the order of wanted
	blockKeys []string                    // with the cache: per ref, its block's key
	versions  []uint64                    // with the cache: per ref, its block's version
	msTicks   []buckets.Ticks             // values left by newestPerMs
	msVals    []float64
	refs      []Ref  // buffers of table, reused from table to table
	distinct  []bool // per ref: no two of its readings share a millisecond
	order     []int
	group     []int
	p         pass // the Table call in progress
	// The callbacks of a Table call, made on the first: one each per
	// aggregator, not one per table or block.
	first, second func(Block) (bool, error)
	value         func(v []byte) error
}

// aggBucket is one bucket being summed: few names, so a slice, which
// becomes the bucket's Values in the page.
type aggBucket struct {
	start buckets.Ticks
	vals  []buckets.NamedSummary
}

// New returns an aggregator for q with room for about hint
// buckets.
func New(q buckets.AggregateQuery, hint int) *Aggregator {
	a := &Aggregator{q: q, bs: make([]aggBucket, 0, hint),
		names: make(map[string]string), slabSize: min(max(hint, 4), slabSize)}
	if len(q.Fields) > 0 {
		a.width = len(q.Fields)
		a.fields = make(map[string]bool, len(q.Fields))
		for _, f := range q.Fields {
			a.fields[f] = true
		}
		for f := range a.fields {
			a.wanted = append(a.wanted, []byte(f))
		}
		slices.SortFunc(a.wanted, bytes.Compare)
	}
	return a
}

// UseCache makes the aggregator keep and look up decoded columns and
// block lists in c (nil: none); it uses them only when the query names
// its values.
func (a *Aggregator) UseCache(c *colcache.Cache[*BlockList]) { a.cols = c }

// Device is the device of the query.
func (a *Aggregator) Device() buckets.DeviceID { return a.q.Device }

// Fields is the set of the value names the query asks for; nil: every
// name.
func (a *Aggregator) Fields() map[string]bool { return a.fields }

// Len is the number of buckets the aggregator holds.
func (a *Aggregator) Len() int { return len(a.bs) }

// Unslotted is the number of buckets the aggregator holds outside the
// span Span made room for.
func (a *Aggregator) Unslotted() int { return len(a.buckets) }

// Counts says how the blocks added so far were read: from their
// header, column by column, or decoded into readings.
func (a *Aggregator) Counts() (headers, columns, decoded int) {
	return a.headers, a.columns, a.decoded
}

// Span makes room to find the buckets of [from, to) by their position
// instead of in a map, when there are at most MaxBucketsHint of them
// and not many more than the page can hold (a small page of a long
// span keeps the map).
func (a *Aggregator) Span(from, to buckets.Ticks) {
	if to <= from {
		return
	}
	a.base = a.BucketOf(from)
	n := (to-1-a.base)/a.q.Interval + 1
	if n <= MaxBucketsHint && n/4 <= buckets.Ticks(a.q.Limit) {
		a.slots = make([]int32, n)
	}
}

// slot returns the slot of the bucket starting at start, or nil when
// it has none.
func (a *Aggregator) slot(start buckets.Ticks) *int32 {
	if start < a.base || a.slots == nil {
		return nil
	}
	if k := (start - a.base) / a.q.Interval; k < buckets.Ticks(len(a.slots)) {
		return &a.slots[k]
	}
	return nil
}

// BucketOf is the start of the bucket holding k.
func (a *Aggregator) BucketOf(k buckets.Ticks) buckets.Ticks {
	off := (k - unixEpoch) % a.q.Interval
	if off < 0 {
		off += a.q.Interval
	}
	return k - off
}

// Summary returns the summary of name in the bucket starting at start,
// or nil when the query leaves name out. name may be a byte slice
// converted in the call: it is copied only when first seen.
func (a *Aggregator) Summary(start buckets.Ticks, name []byte) *buckets.Summary {
	if a.fields != nil && !a.fields[string(name)] {
		return nil
	}
	var i int
	var ok bool
	slot := a.slot(start)
	if slot != nil {
		i, ok = int(*slot)-1, *slot > 0
	} else {
		i, ok = a.buckets[start]
	}
	if !ok {
		i = len(a.bs)
		a.bs = append(a.bs, aggBucket{start: start})
		if slot != nil {
			*slot = int32(i + 1)
		} else {
			if a.buckets == nil {
				a.buckets = make(map[buckets.Ticks]int)
			}
			a.buckets[start] = i
		}
		a.maxStart = max(a.maxStart, start)
	}
	b := &a.bs[i]
	for i := range b.vals {
		if b.vals[i].Name == string(name) {
			return &b.vals[i].Summary
		}
	}
	interned, ok := a.names[string(name)]
	if !ok {
		interned = string(name)
		a.names[interned] = interned
	}
	if len(b.vals) == 0 { // the first name: room for as many as the widest bucket from the slab
		w := max(a.width, 1)
		if cap(a.slab)-len(a.slab) < w {
			a.slab = make([]buckets.NamedSummary, 0, max(a.slabSize, w))
			a.slabSize = min(2*a.slabSize, slabSize)
		}
		n := len(a.slab)
		a.slab = a.slab[:n+w]
		b.vals = a.slab[n : n : n+w]
	}
	a.width = max(a.width, len(b.vals)+1)
	b.vals = append(b.vals, buckets.NamedSummary{Name: interned})
	return &b.vals[len(b.vals)-1].Summary
}

// FinalBefore counts the buckets that start before start.
func (a *Aggregator) FinalBefore(start buckets.Ticks) int {
	if a.maxStart < start {
		return len(a.bs)
	}
	n := 0
	for i := range a.bs {
		if a.bs[i].start < start {
			n++
		}
	}
	return n
}

// addColumn adds the values vals of name observed at ticks (increasing)
// that lie in [lo, hi), a run per bucket; distinct says no two of the
// ticks share a millisecond.
func (a *Aggregator) addColumn(name []byte, ticks []buckets.Ticks, vals []float64, distinct bool, lo, hi buckets.Ticks) {
	if a.q.PerMillisecond && !distinct {
		ticks, vals = a.newestPerMs(ticks, vals)
	}
	i, _ := slices.BinarySearch(ticks, lo)
	n, _ := slices.BinarySearch(ticks, hi)
	for i < n {
		start := a.BucketOf(ticks[i])
		j := n
		if end := start + a.q.Interval; end > ticks[i] && end < hi { // end <= ticks[i]: overflow
			j, _ = slices.BinarySearch(ticks[i:n], end)
			j += i
		}
		foldRun(a.Summary(start, name), ticks[i:j], vals[i:j])
		i = j
	}
}

// AddChunk adds the numeric values in [lo, hi) of a block's readings
// (sorted by time, overlapping no other block) as addColumns adds them
// from the block's columns: per name, runs of one bucket folded in
// time order.
func (a *Aggregator) AddChunk(rs []buckets.Reading, lo, hi buckets.Ticks) {
	type column struct {
		ticks []buckets.Ticks
		vals  []float64
	}
	cols := make(map[string]*column)
	var names []string
	for _, r := range rs {
		if r.Ticks < lo || r.Ticks >= hi {
			continue
		}
		for _, f := range r.Values {
			x, ok := buckets.Numeric(f.Value)
			if !ok || !a.wants([]byte(f.Name)) {
				continue
			}
			c := cols[f.Name]
			if c == nil {
				c = &column{}
				cols[f.Name] = c
				names = append(names, f.Name)
			}
			c.ticks, c.vals = append(c.ticks, r.Ticks), append(c.vals, x)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		c := cols[name]
		for i := 0; i < len(c.ticks); {
			start := a.BucketOf(c.ticks[i])
			j, _ := slices.BinarySearchFunc(c.ticks[i:], start+a.q.Interval, cmp.Compare[buckets.Ticks])
			j += i
			foldRun(a.Summary(start, []byte(name)), c.ticks[i:j], c.vals[i:j])
			i = j
		}
	}
	a.columns++
}

// newestPerMs returns ticks and vals (ticks increasing) without the
// values followed by another of the same millisecond, in the
// aggregator's buffers when some are dropped.
func (a *Aggregator) newestPerMs(ticks []buckets.Ticks, vals []float64) ([]buckets.Ticks, []float64) {
	i := 1
	for i < len(ticks) && ticks[i]/ticksPerMs != ticks[i-1]/ticksPerMs {
		i++
	}
	if i >= len(ticks) {
		return ticks, vals
	}
	ts, vs := append(a.msTicks[:0], ticks[:i-1]...), append(a.msVals[:0], vals[:i-1]...)
	for j := i; j <= len(ticks); j++ {
		if j == len(ticks) || ticks[j]/ticksPerMs != ticks[j-1]/ticksPerMs {
			ts, vs = append(ts, ticks[j-1]), append(vs, vals[j-1])
		}
	}
	a.msTicks, a.msVals = ts, vs
	return ts, vs
}

// foldRun adds to s the values vals observed at ticks, strictly
// increasing, exactly as s.Add would one by one (same order of sums,
// min and max with the same NaN and signed-zero rules).
func foldRun(s *buckets.Summary, ticks []buckets.Ticks, vals []float64) {
	if len(vals) == 0 {
		return
	}
	if s.Count == 0 {
		s.Add(ticks[0], vals[0])
		ticks, vals = ticks[1:], vals[1:]
		if len(vals) == 0 {
			return
		}
	}
	sum, lo, hi := s.Sum, s.Min, s.Max
	for _, x := range vals {
		sum += x
		lo, hi = min(lo, x), max(hi, x)
	}
	s.Count += int64(len(vals))
	s.Sum, s.Min, s.Max = sum, lo, hi
	if ticks[0] < s.FirstTicks {
		s.First, s.FirstTicks = vals[0], ticks[0]
	}
	if last := len(ticks) - 1; ticks[last] >= s.LastTicks {
		s.Last, s.LastTicks = vals[last], ticks[last]
	}
}

// Release hands the aggregator's scanner back for other aggregates.
func (a *Aggregator) Release() {
	if a.scan != nil {
		scanners.Put(a.scan)
		a.scan = nil
	}
}

// wants reports whether the query asks for name.
func (a *Aggregator) wants(name []byte) bool { return a.fields == nil || a.fields[string(name)] }

// addReadings adds resolved readings, each (device, ticks) once; per
// millisecond, only the newest value of a name in each millisecond.
func (a *Aggregator) addReadings(rs []buckets.Reading) {
	var newer map[string]buckets.Ticks // per name, the millisecond of the value added last
	if a.q.PerMillisecond {
		slices.SortFunc(rs, func(x, y buckets.Reading) int { return cmp.Compare(y.Ticks, x.Ticks) })
		newer = make(map[string]buckets.Ticks)
	}
	for _, r := range rs {
		start := a.BucketOf(r.Ticks)
		for _, f := range r.Values {
			if x, ok := buckets.Numeric(f.Value); ok {
				if newer != nil {
					if ms, seen := newer[f.Name]; seen && ms == r.Ticks/ticksPerMs {
						continue
					}
					newer[f.Name] = r.Ticks / ticksPerMs
				}
				if s := a.Summary(start, []byte(f.Name)); s != nil {
					s.Add(r.Ticks, x)
				}
			}
		}
	}
}

// Page returns the first Limit buckets with numeric values, oldest
// first.
func (a *Aggregator) Page() buckets.AggregatePage {
	// Sort small keys, not the buckets: blocks come newest first, so
	// the buckets are in runs that need moving.
	type key struct {
		start buckets.Ticks
		i     int
	}
	keys := make([]key, 0, len(a.bs))
	for i := range a.bs {
		if len(a.bs[i].vals) > 0 {
			keys = append(keys, key{a.bs[i].start, i})
		}
	}
	slices.SortFunc(keys, func(x, y key) int { return cmp.Compare(x.start, y.start) })
	p := buckets.AggregatePage{Buckets: make([]buckets.AggregateBucket, 0, min(len(keys), a.q.Limit))}
	if len(keys) > a.q.Limit {
		keys, p.More = keys[:a.q.Limit], true
	}
	for _, k := range keys {
		ab := &a.bs[k.i]
		b := buckets.AggregateBucket{Start: ab.start, Values: ab.vals[:len(ab.vals):len(ab.vals)]}
		slices.SortFunc(b.Values, func(x, y buckets.NamedSummary) int { return cmp.Compare(x.Name, y.Name) })
		p.Buckets = append(p.Buckets, b)
	}
	return p
}
