package aggregate

import (
	"bytes"
	"slices"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/colcache"
)

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
func (a *Aggregator) cachePending(gen uint64, bi Block, header bool) {
	i := 0
	for _, name := range a.wanted {
		col := &colcache.Column{}
		if i < len(a.pending) && bytes.Equal(a.pending[i].name, name) {
			col = a.pending[i].col
			i++
		}
		a.key = cacheKey(a.key[:0], header, gen, bi.Item.Version(), bi.Item.Key(), name)
		a.cols.Put(a.key, col)
	}
	clear(a.pending)
	a.pending = a.pending[:0]
}

// addCached adds the block of bi, which overlaps no other block, from
// the column cache (its header summaries when header, else its
// columns) when it holds every wanted name of it, and reports whether
// it did; when one is missing it adds nothing.
func (a *Aggregator) addCached(gen uint64, bi Block, header bool, lo, hi buckets.Ticks) bool {
	a.cached = a.cached[:0]
	if !a.caching() || !lookup(a, gen, bi.Item.Version(), bi.Item.Key(), header) {
		return false
	}
	a.addLookedUp(bi.Ref, header, bi.Distinct, lo, hi)
	return true
}

// caching reports whether the aggregator uses the column cache: there
// is one, and the query names its values.
func (a *Aggregator) caching() bool { return a.cols != nil && a.wanted != nil }

// cacheKey is colcache.HeaderKey when header, else colcache.Key.
func cacheKey[K ~string | ~[]byte](dst []byte, header bool, gen, version uint64, blockKey K, name []byte) []byte {
	if header {
		return colcache.HeaderKey(dst, gen, version, blockKey, name)
	}
	return colcache.Key(dst, gen, version, blockKey, name)
}

// BlockList is what the first pass over a device's keys in a table saw
// at one version of the table: every block whose newest reading is at
// or after cover, newest first.
type BlockList struct {
	cover  buckets.Ticks
	blocks []listedBlock
}

// listedBlock is one block of a BlockList.
type listedBlock struct {
	ref      Ref
	key      string
	version  uint64
	distinct bool // no two of its readings share a millisecond
}

// add appends the block of bi.
func (l *BlockList) add(bi Block) {
	l.blocks = append(l.blocks, listedBlock{ref: bi.Ref, key: string(bi.Item.Key()), version: bi.Item.Version(),
		distinct: bi.Distinct})
}

// size is about the bytes l holds.
func (l *BlockList) size() int {
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
func (a *Aggregator) fromCachedList(gen, readTs uint64, lo, hi buckets.Ticks) bool {
	a.key = colcache.ListKey(a.key[:0], gen, readTs, a.q.Device)
	list, ok := a.cols.GetList(a.key)
	if !ok || list.cover > lo {
		return false
	}
	n := len(list.blocks)
	a.refs, a.distinct = slices.Grow(a.refs[:0], n), slices.Grow(a.distinct[:0], n)
	a.blockKeys, a.versions = slices.Grow(a.blockKeys[:0], n), slices.Grow(a.versions[:0], n)
	for _, b := range list.blocks {
		if b.ref.Newest < lo {
			break
		}
		if b.ref.Oldest < hi {
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
func (a *Aggregator) addAllCached(gen uint64, group []int, lo, hi buckets.Ticks) bool {
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
func lookup[K ~string | ~[]byte](a *Aggregator, gen, version uint64, blockKey K, header bool) bool {
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
func (a *Aggregator) addLookedUp(ref Ref, header, distinct bool, lo, hi buckets.Ticks) {
	if header {
		start := a.BucketOf(ref.Oldest)
		for i, col := range a.cached {
			if col.Summary.Count > 0 {
				a.Summary(start, a.wanted[i]).Merge(col.Summary)
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
func (a *Aggregator) addCachedColumn(name []byte, col *colcache.Column, ref Ref, distinct bool, lo, hi buckets.Ticks) {
	if ref.Oldest < lo || ref.Newest >= hi || (a.q.PerMillisecond && !distinct) {
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
		if s := a.Summary(b.Start, name); s.Count == 0 {
			*s = b.Summary
		} else {
			foldRun(s, col.Ticks[b.Lo:b.Hi], col.Vals[b.Lo:b.Hi])
		}
	}
}

// fold folds the values of col into the query's buckets, in the runs
// addColumn folds them in.
func (a *Aggregator) fold(col *colcache.Column) *colcache.Fold {
	f := &colcache.Fold{Interval: a.q.Interval}
	ticks := col.Ticks
	for i := 0; i < len(ticks); {
		start := a.BucketOf(ticks[i])
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
