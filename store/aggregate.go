package store

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
	"github.com/telemetryd/telemetryd/store/colcache"
)

// unixEpoch is 1970-01-01T00:00:00Z in ticks: buckets are aligned to
// multiples of their width since then.
var unixEpoch = buckets.MustTicks(time.Unix(0, 0))

// Aggregate summarises the numeric values of q.Device per bucket of
// q.Interval ticks (aligned to multiples of it since the Unix epoch)
// over q.From <= ticks < q.To: per value name its count, sum, min, max,
// first and last. Buckets come oldest first, at most q.Limit of them,
// resuming behind the bucket that starts at *q.After when it is set;
// More says whether more buckets follow. Readings with the same
// (device, ticks) count once, with their merged values.
//
// A block that lies wholly inside one bucket and overlaps no other
// block of the device is summarised from its header alone (per
// millisecond, only when the block says no two of its readings share
// one); blocks cut by bucket edges have only their time column and the
// wanted values' columns read; only blocks that overlap others are
// decoded into readings.
func (s *Store) Aggregate(ctx context.Context, q buckets.AggregateQuery) (buckets.AggregatePage, error) {
	if q.Interval < buckets.TicksPerSecond {
		return buckets.AggregatePage{}, fmt.Errorf("%w: aggregate: interval of %d ticks is less than one second", buckets.ErrInvalidArgument, q.Interval)
	}
	if q.Limit <= 0 {
		return buckets.AggregatePage{}, fmt.Errorf("%w: aggregate: limit %d must be positive", buckets.ErrInvalidArgument, q.Limit)
	}
	if err := s.Ping(ctx); err != nil {
		return buckets.AggregatePage{}, err
	}
	from, to := max(q.From, 0), min(q.To, buckets.MaxTicks+1)
	if q.After != nil {
		if *q.After > buckets.MaxTicks-q.Interval {
			return buckets.AggregatePage{Buckets: []buckets.AggregateBucket{}}, nil
		}
		from = max(from, *q.After+q.Interval)
	}
	if s.rollupsOn() {
		if p, ok, err := s.aggregateRollups(ctx, q, from, to); ok || err != nil {
			return p, err
		}
	}
	first, last, ok := s.index.Bounds(q.Device)
	if ok {
		from = max(from, buckets.DayOf(first).Start())
		to = min(to, buckets.DayOf(last).End())
	}
	if !ok || from >= to {
		return newAggregator(q, 0).page(), nil
	}
	agg := newAggregator(q, int(min(int64((to-from)/q.Interval)+1, int64(q.Limit)+1, maxBucketsHint)))
	agg.span(from, to)
	agg.cols = s.cols
	defer agg.release()
	for _, d := range s.daysBetween(buckets.DayOf(from), buckets.DayOf(to-1), buckets.Asc) {
		done, err := s.aggregateDay(ctx, agg, d, max(from, d.Start()), min(to, d.End()))
		if err != nil {
			return buckets.AggregatePage{}, err
		}
		if done {
			break
		}
	}
	return agg.page(), nil
}

// aggregateDay adds the readings of the table of d in [lo, hi) to agg;
// done says that the page is complete.
func (s *Store) aggregateDay(ctx context.Context, agg *aggregator, d buckets.Day, lo, hi buckets.Ticks) (done bool, err error) {
	t, err := s.acquireQuery(ctx, d)
	if err != nil || t == nil {
		return false, err
	}
	err = s.guard(t, func() error {
		done, err = agg.table(ctx, t, lo, hi)
		return err
	})
	s.release(t)
	if err != nil {
		return false, classify(fmt.Errorf("aggregate table %s: %w", d, err))
	}
	return done, nil
}

// ticksPerMs is the ticks of one millisecond; the Unix epoch is a
// multiple of it, so k / ticksPerMs numbers the milliseconds.
const ticksPerMs = buckets.TicksPerSecond / 1000

// maxBucketsHint bounds the buckets an aggregator makes room for
// before it sees them.
const maxBucketsHint = 4096

// slabSize is the most summaries an aggregator allocates at
// once for its buckets; it starts with fewer when it expects few
// buckets.
const slabSize = 256

// aggregator accumulates the buckets of one query.
type aggregator struct {
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
	cols      *colcache.Cache[*blockList] // decoded columns and block lists; nil: none
	wanted    [][]byte                    // the names of q.Fields, distinct and sorted (the names a column read keeps)
	key       []byte                      // buffer of column cache keys
	pending   []pendingColumn             // columns of the block being read, cached once it is read whole
	cached    []*colcache.Column          // cached columns being added: per block, in the order of wanted
	blockKeys []string                    // with the cache: per ref, its block's key
	versions  []uint64                    // with the cache: per ref, its block's version
	msTicks   []buckets.Ticks             // values left by newestPerMs
	msVals    []float64
	refs      []blockRef // buffers of table, reused from table to table
	distinct  []bool     // per ref: no two of its readings share a millisecond
	order     []int
	group     []int
}

// aggBucket is one bucket being summed: few names, so a slice, which
// becomes the bucket's Values in the page.
type aggBucket struct {
	start buckets.Ticks
	vals  []buckets.NamedSummary
}

// newAggregator returns an aggregator for q with room for about hint
// buckets.
func newAggregator(q buckets.AggregateQuery, hint int) *aggregator {
	a := &aggregator{q: q, bs: make([]aggBucket, 0, hint),
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

// span makes room to find the buckets of [from, to) by their position
// instead of in a map, when there are at most maxBucketsHint of them
// and not many more than the page can hold (a small page of a long
// span keeps the map).
func (a *aggregator) span(from, to buckets.Ticks) {
	if to <= from {
		return
	}
	a.base = a.bucketOf(from)
	n := (to-1-a.base)/a.q.Interval + 1
	if n <= maxBucketsHint && n/4 <= buckets.Ticks(a.q.Limit) {
		a.slots = make([]int32, n)
	}
}

// slot returns the slot of the bucket starting at start, or nil when
// it has none.
func (a *aggregator) slot(start buckets.Ticks) *int32 {
	if start < a.base || a.slots == nil {
		return nil
	}
	if k := (start - a.base) / a.q.Interval; k < buckets.Ticks(len(a.slots)) {
		return &a.slots[k]
	}
	return nil
}

// bucketOf is the start of the bucket holding k.
func (a *aggregator) bucketOf(k buckets.Ticks) buckets.Ticks {
	off := (k - unixEpoch) % a.q.Interval
	if off < 0 {
		off += a.q.Interval
	}
	return k - off
}

// summary returns the summary of name in the bucket starting at start,
// or nil when the query leaves name out. name may be a byte slice
// converted in the call: it is copied only when first seen.
func (a *aggregator) summary(start buckets.Ticks, name []byte) *buckets.Summary {
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

// finalBefore counts the buckets that start before start.
func (a *aggregator) finalBefore(start buckets.Ticks) int {
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

// table adds the readings of t in [lo, hi). done says that the page is
// complete: more than Limit buckets are final.
//
// A first pass over the keys finds the blocks and which of them lie
// alone in one bucket; a second pass reads those from their headers in
// place, reads the other blocks that overlap no block column by column
// and decodes the rest into readings, each group of overlapping blocks
// resolved together.
//
// Long: the two passes walk the same keys and must meet the same blocks
// in the same order; they read best side by side.
func (a *aggregator) table(ctx context.Context, t *table, lo, hi buckets.Ticks) (done bool, err error) {
	if a.finalBefore(a.bucketOf(lo)) > a.q.Limit {
		return true, nil
	}
	txn, release := t.readTxn()
	defer release()
	caching := a.caching()
	if caching && a.fromCachedList(t.gen, txn.ReadTs(), lo, hi) {
		return false, nil
	}
	it := newBlockIterator(txn, a.q.Device) // both passes
	defer it.Close()
	refs, distinct := a.refs[:0], a.distinct[:0]
	a.blockKeys, a.versions = a.blockKeys[:0], a.versions[:0]
	var list *blockList
	if caching {
		list = &blockList{cover: lo}
	}
	err = it.each(lo, func(bi blockItem) (bool, error) {
		if list != nil {
			list.add(bi)
		}
		if bi.ref.oldest < hi {
			refs = append(refs, bi.ref)
			distinct = append(distinct, bi.item.UserMeta()&metaDistinctMs != 0)
			if list != nil { // the key the list copied, not a second copy
				lb := &list.blocks[len(list.blocks)-1]
				a.blockKeys, a.versions = append(a.blockKeys, lb.key), append(a.versions, lb.version)
			}
		}
		return true, nil
	})
	a.refs, a.distinct = refs, distinct
	if err != nil {
		return false, err
	}
	if list != nil {
		a.key = colcache.ListKey(a.key[:0], t.gen, txn.ReadTs(), a.q.Device)
		a.cols.PutList(a.key, list, list.size())
	}
	if len(refs) == 0 {
		return false, nil
	}
	group := a.groups(refs, lo, hi)
	if caching && a.addAllCached(t.gen, group, lo, hi) {
		return false, nil
	}
	var res map[int]*resolver
	next := 0 // the second pass meets the same blocks in the same order
	err = it.each(lo, func(bi blockItem) (bool, error) {
		if err := ctx.Err(); err != nil { // every block: a wide device's block takes long
			return false, err
		}
		if bi.ref.oldest >= hi {
			return true, nil
		}
		if next >= len(refs) || refs[next] != bi.ref {
			return false, fmt.Errorf("block %s..%s: not seen by the first pass", bi.ref.oldest.FormatTime(), bi.ref.newest.FormatTime())
		}
		g := group[next]
		next++
		if (g == alone || g == whole) && a.addCached(t.gen, bi, g == whole, lo, hi) {
			return true, nil
		}
		err := bi.item.Value(func(v []byte) error {
			if err := checkFlag(bi.item.UserMeta(), v); err != nil {
				return &blockError{ref: bi.ref, err: err}
			}
			if g == whole {
				if err := a.addHeader(bi.ref, v); err != nil {
					return err
				}
				if caching {
					a.cachePending(t.gen, bi, true)
				}
				return nil
			}
			if g == alone {
				return a.addColumns(t.gen, bi, v, lo, hi)
			}
			_, rs, err := block.Decode(v, a.q.Device)
			if err != nil {
				return &blockError{ref: bi.ref, err: err}
			}
			a.decoded++
			if res == nil {
				res = make(map[int]*resolver)
			}
			if res[g] == nil {
				res[g] = newResolver()
			}
			res[g].add(rs, bi.ref.seq, lo, hi)
			return nil
		})
		if t.bad.skip(ctx, t.day, a.q.Device, err) {
			return true, ctx.Err()
		}
		return true, err
	})
	for _, r := range res {
		a.addReadings(r.rs)
	}
	return false, err
}

// Groups of blocks that overlap no other block.
const (
	whole = -1 // lies in one bucket inside [lo, hi): its header is enough
	alone = -2 // spans buckets or an edge: its columns are read
)

// groups returns, for each block of refs (in the order of refs), the
// number of the group of blocks overlapping it (blocks whose readings
// must be resolved together), or whole or alone when it overlaps no
// other block.
func (a *aggregator) groups(refs []blockRef, lo, hi buckets.Ticks) []int {
	order := slices.Grow(a.order[:0], len(refs))
	for i := range refs {
		order = append(order, i)
	}
	a.order = order
	slices.SortFunc(order, func(x, y int) int { return cmp.Compare(refs[x].oldest, refs[y].oldest) })
	group := slices.Grow(a.group[:0], len(refs))[:len(refs)]
	a.group = group
	// Per millisecond, blocks that share a millisecond are resolved
	// together too.
	grain := buckets.Ticks(1)
	if a.q.PerMillisecond {
		grain = ticksPerMs
	}
	for i := 0; i < len(order); {
		n, end := 1, refs[order[i]].newest
		for i+n < len(order) && refs[order[i+n]].oldest/grain <= end/grain {
			end = max(end, refs[order[i+n]].newest)
			n++
		}
		for _, x := range order[i : i+n] {
			group[x] = i
		}
		r := refs[order[i]]
		switch {
		case n > 1:
		case a.q.PerMillisecond && r.count > 1 && !a.distinct[order[i]]:
			// Its header may count two readings of one millisecond.
			group[order[i]] = alone
		case r.oldest >= lo && r.newest < hi && a.bucketOf(r.oldest) == a.bucketOf(r.newest):
			group[order[i]] = whole
		default:
			group[order[i]] = alone
		}
		i += n
	}
	return group
}

// addHeader adds a block that lies in one bucket from its header. With
// the column cache, the summaries of the wanted names are left in
// a.pending for cachePending.
func (a *aggregator) addHeader(ref blockRef, v []byte) error {
	start := a.bucketOf(ref.oldest)
	caching := a.caching()
	a.pending = a.pending[:0]
	_, _, err := block.EachSummary(v, func(name []byte, sum buckets.Summary) {
		if s := a.summary(start, name); s != nil {
			s.Merge(sum)
			if caching {
				a.pending = append(a.pending, pendingColumn{name, &colcache.Column{Summary: sum}})
			}
		}
	})
	if err != nil {
		return &blockError{ref: ref, err: err}
	}
	a.headers++
	return nil
}

// addColumns adds the numeric values in [lo, hi) of a block that
// overlaps no other block, column by column: every (device, ticks) is
// in it once, so nothing needs resolving. When the query names its
// values, the columns it read (and an empty one for each name the block
// lacks) go into the column cache once the whole block read cleanly.
func (a *aggregator) addColumns(gen uint64, bi blockItem, v []byte, lo, hi buckets.Ticks) error {
	if a.scan == nil {
		a.scan = scanners.Get().(*block.Scanner)
	}
	caching := a.caching()
	distinct := bi.item.UserMeta()&metaDistinctMs != 0
	a.pending = a.pending[:0]
	err := a.scan.Numeric(v, a.wants, func(name []byte, ticks []buckets.Ticks, vals []float64) {
		if caching {
			a.pending = append(a.pending, pendingColumn{name, colcache.Copy(ticks, vals)})
		}
		a.addColumn(name, ticks, vals, distinct, lo, hi)
	})
	if err != nil {
		return &blockError{ref: bi.ref, err: err}
	}
	a.columns++
	if caching {
		a.cachePending(gen, bi, false)
	}
	return nil
}

// pendingColumn is a column read from a block, waiting for the rest of
// the block to read cleanly before it is cached.
type pendingColumn struct {
	name []byte // valid while the block's bytes are
	col  *colcache.Column
}

// cachePending puts the columns (or header summaries) of the block of
// bi just read, and an empty one for each wanted name it lacks, into
// the column cache. Blocks hand out names in order, as wanted is
// sorted.
func (a *aggregator) cachePending(gen uint64, bi blockItem, header bool) {
	i := 0
	for _, name := range a.wanted {
		col := &colcache.Column{}
		if i < len(a.pending) && bytes.Equal(a.pending[i].name, name) {
			col = a.pending[i].col
			i++
		}
		a.key = cacheKey(a.key[:0], header, gen, bi.item.Version(), bi.item.Key(), name)
		a.cols.Put(a.key, col)
	}
	clear(a.pending)
	a.pending = a.pending[:0]
}

// addCached adds the block of bi, which overlaps no other block, from
// the column cache (its header summaries when header, else its
// columns) when it holds every wanted name of it, and reports whether
// it did; when one is missing it adds nothing.
func (a *aggregator) addCached(gen uint64, bi blockItem, header bool, lo, hi buckets.Ticks) bool {
	a.cached = a.cached[:0]
	if !a.caching() || !lookup(a, gen, bi.item.Version(), bi.item.Key(), header) {
		return false
	}
	a.addLookedUp(bi.ref, header, bi.item.UserMeta()&metaDistinctMs != 0, lo, hi)
	return true
}

// caching reports whether the aggregator uses the column cache: there
// is one, and the query names its values.
func (a *aggregator) caching() bool { return a.cols != nil && a.wanted != nil }

// cacheKey is colcache.HeaderKey when header, else colcache.Key.
func cacheKey[K ~string | ~[]byte](dst []byte, header bool, gen, version uint64, blockKey K, name []byte) []byte {
	if header {
		return colcache.HeaderKey(dst, gen, version, blockKey, name)
	}
	return colcache.Key(dst, gen, version, blockKey, name)
}

// blockList is what the first pass over a device's keys in a table saw
// at one version of the table: every block whose newest reading is at
// or after cover, newest first.
type blockList struct {
	cover  buckets.Ticks
	blocks []listedBlock
}

// listedBlock is one block of a blockList.
type listedBlock struct {
	ref      blockRef
	key      string
	version  uint64
	distinct bool // no two of its readings share a millisecond
}

// add appends the block of bi.
func (l *blockList) add(bi blockItem) {
	l.blocks = append(l.blocks, listedBlock{ref: bi.ref, key: string(bi.item.Key()), version: bi.item.Version(),
		distinct: bi.item.UserMeta()&metaDistinctMs != 0})
}

// size is about the bytes l holds.
func (l *blockList) size() int {
	n := 32
	for _, b := range l.blocks {
		n += 80 + len(b.key)
	}
	return n
}

// fromCachedList adds the blocks of the table, read at readTs, from the
// column cache without walking its keys, when the cache holds the
// device's block list at that version (covering lo) and every wanted
// column of every block in [lo, hi), each block overlapping no other;
// it reports whether it did. Otherwise it adds nothing.
func (a *aggregator) fromCachedList(gen, readTs uint64, lo, hi buckets.Ticks) bool {
	a.key = colcache.ListKey(a.key[:0], gen, readTs, a.q.Device)
	list, ok := a.cols.GetList(a.key)
	if !ok || list.cover > lo {
		return false
	}
	n := len(list.blocks)
	a.refs, a.distinct = slices.Grow(a.refs[:0], n), slices.Grow(a.distinct[:0], n)
	a.blockKeys, a.versions = slices.Grow(a.blockKeys[:0], n), slices.Grow(a.versions[:0], n)
	for _, b := range list.blocks {
		if b.ref.newest < lo {
			break
		}
		if b.ref.oldest < hi {
			a.refs = append(a.refs, b.ref)
			a.distinct = append(a.distinct, b.distinct)
			a.blockKeys = append(a.blockKeys, b.key)
			a.versions = append(a.versions, b.version)
		}
	}
	if len(a.refs) == 0 {
		return true
	}
	return a.addAllCached(gen, a.groups(a.refs, lo, hi), lo, hi)
}

// addAllCached adds every block of the table from the column cache when
// no block overlaps another and the cache holds every wanted name of
// each (header summaries for a block inside one bucket, else columns),
// in the order the second pass would add them (so the sums are the same
// to the bit), and reports whether it did; then the table's blocks need
// not be walked again. Otherwise it adds nothing.
func (a *aggregator) addAllCached(gen uint64, group []int, lo, hi buckets.Ticks) bool {
	for _, g := range group {
		if g != alone && g != whole {
			return false
		}
	}
	a.cached = slices.Grow(a.cached[:0], len(a.refs)*len(a.wanted))
	for i := range a.refs {
		if !lookup(a, gen, a.versions[i], a.blockKeys[i], group[i] == whole) {
			return false
		}
	}
	cols := a.cached
	for i := range a.refs {
		a.cached = cols[i*len(a.wanted) : (i+1)*len(a.wanted)]
		a.addLookedUp(a.refs[i], group[i] == whole, a.distinct[i], lo, hi)
	}
	clear(cols)
	a.cached = cols[:0]
	return true
}

// lookup appends to a.cached the wanted columns (header summaries when
// header) of the block under blockKey at version, and reports whether
// the cache held them all.
func lookup[K ~string | ~[]byte](a *aggregator, gen, version uint64, blockKey K, header bool) bool {
	for _, name := range a.wanted {
		a.key = cacheKey(a.key[:0], header, gen, version, blockKey, name)
		col, ok := a.cols.Get(a.key)
		if !ok {
			return false
		}
		a.cached = append(a.cached, col)
	}
	return true
}

// addLookedUp adds the block of ref from a.cached (in the order of
// wanted): its header summaries when header, else its columns; distinct
// says no two of its readings share a millisecond.
func (a *aggregator) addLookedUp(ref blockRef, header, distinct bool, lo, hi buckets.Ticks) {
	if header {
		start := a.bucketOf(ref.oldest)
		for i, col := range a.cached {
			if col.Summary.Count > 0 {
				a.summary(start, a.wanted[i]).Merge(col.Summary)
			}
		}
		a.headers++
		return
	}
	for i, col := range a.cached {
		if len(col.Vals) > 0 {
			a.addCachedColumn(a.wanted[i], col, ref, distinct, lo, hi)
		}
	}
	a.columns++
}

// addCachedColumn adds the cached column col of name in the block of
// ref. When the block lies inside [lo, hi) and none of its values is
// dropped per millisecond, it adds the column's fold into the query's
// buckets (made on first use and kept with the column): a bucket no
// other block has added to takes the fold's summary, which is what
// folding the values into it makes, to the bit; any other bucket folds
// the values.
func (a *aggregator) addCachedColumn(name []byte, col *colcache.Column, ref blockRef, distinct bool, lo, hi buckets.Ticks) {
	if ref.oldest < lo || ref.newest >= hi || (a.q.PerMillisecond && !distinct) {
		a.addColumn(name, col.Ticks, col.Vals, distinct, lo, hi)
		return
	}
	f := col.Fold(a.q.Interval)
	if f == nil {
		f = a.fold(col)
		col.KeepFold(f)
	}
	for i := range f.Buckets {
		b := &f.Buckets[i]
		if s := a.summary(b.Start, name); s.Count == 0 {
			*s = b.Summary
		} else {
			foldRun(s, col.Ticks[b.Lo:b.Hi], col.Vals[b.Lo:b.Hi])
		}
	}
}

// fold folds the values of col into the query's buckets, in the runs
// addColumn folds them in.
func (a *aggregator) fold(col *colcache.Column) *colcache.Fold {
	f := &colcache.Fold{Interval: a.q.Interval}
	ticks := col.Ticks
	for i := 0; i < len(ticks); {
		start := a.bucketOf(ticks[i])
		j := len(ticks)
		if end := start + a.q.Interval; end > ticks[i] { // else overflow: the last bucket
			j, _ = slices.BinarySearch(ticks[i:], end)
			j += i
		}
		b := colcache.FoldBucket{Start: start, Lo: int32(i), Hi: int32(j)}
		foldRun(&b.Summary, ticks[i:j], col.Vals[i:j])
		f.Buckets = append(f.Buckets, b)
		i = j
	}
	return f
}

// addColumn adds the values vals of name observed at ticks (increasing)
// that lie in [lo, hi), a run per bucket; distinct says no two of the
// ticks share a millisecond.
func (a *aggregator) addColumn(name []byte, ticks []buckets.Ticks, vals []float64, distinct bool, lo, hi buckets.Ticks) {
	if a.q.PerMillisecond && !distinct {
		ticks, vals = a.newestPerMs(ticks, vals)
	}
	i, _ := slices.BinarySearch(ticks, lo)
	n, _ := slices.BinarySearch(ticks, hi)
	for i < n {
		start := a.bucketOf(ticks[i])
		j := n
		if end := start + a.q.Interval; end > ticks[i] && end < hi { // end <= ticks[i]: overflow
			j, _ = slices.BinarySearch(ticks[i:n], end)
			j += i
		}
		foldRun(a.summary(start, name), ticks[i:j], vals[i:j])
		i = j
	}
}

// newestPerMs returns ticks and vals (ticks increasing) without the
// values followed by another of the same millisecond, in the
// aggregator's buffers when some are dropped.
func (a *aggregator) newestPerMs(ticks []buckets.Ticks, vals []float64) ([]buckets.Ticks, []float64) {
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

// release hands the aggregator's scanner back to scanners.
func (a *aggregator) release() {
	if a.scan != nil {
		scanners.Put(a.scan)
		a.scan = nil
	}
}

// wants reports whether the query asks for name.
func (a *aggregator) wants(name []byte) bool { return a.fields == nil || a.fields[string(name)] }

// addReadings adds resolved readings, each (device, ticks) once; per
// millisecond, only the newest value of a name in each millisecond.
func (a *aggregator) addReadings(rs []buckets.Reading) {
	var newer map[string]buckets.Ticks // per name, the millisecond of the value added last
	if a.q.PerMillisecond {
		sortReadings(rs, buckets.Desc)
		newer = make(map[string]buckets.Ticks)
	}
	for _, r := range rs {
		start := a.bucketOf(r.Ticks)
		for _, f := range r.Values {
			if x, ok := buckets.Numeric(f.Value); ok {
				if newer != nil {
					if ms, seen := newer[f.Name]; seen && ms == r.Ticks/ticksPerMs {
						continue
					}
					newer[f.Name] = r.Ticks / ticksPerMs
				}
				if s := a.summary(start, []byte(f.Name)); s != nil {
					s.Add(r.Ticks, x)
				}
			}
		}
	}
}

// page returns the first Limit buckets with numeric values, oldest
// first.
func (a *aggregator) page() buckets.AggregatePage {
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
