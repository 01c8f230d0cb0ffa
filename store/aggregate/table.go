package aggregate

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
	"github.com/telemetryd/telemetryd/store/colcache"
)

// Table is one day table as an aggregate reads it: the blocks of the
// aggregate's device at one version of the table.
type Table interface {
	// Gen numbers the opening of the table and ReadTs is the version
	// read: with a block's key and version they key the column cache.
	Gen() uint64
	ReadTs() uint64
	// Blocks calls fn with each block of the device whose newest
	// reading is not older than lo, newest first, until fn returns
	// false or an error. Each call walks from the newest block again.
	Blocks(lo buckets.Ticks, fn func(Block) (bool, error)) error
	// Value calls fn with the bytes of b, valid during the call, after
	// the checks every reader of the table makes; an error of fn is an
	// error of that block.
	Value(b Block, fn func(v []byte) error) error
	// Skip reports whether err, returned by Value, is a damaged block
	// that the aggregate leaves out (the table warns and counts it).
	Skip(ctx context.Context, err error) bool
	// Resolver returns an empty resolver for blocks that overlap.
	Resolver() Resolver
}

// Resolver merges the readings of overlapping blocks: for each ticks
// the reading of the block with the highest sequence wins.
type Resolver interface {
	// Add takes the readings (oldest first) of a block with sequence
	// seq that lie in [lo, hi); rs becomes the resolver's.
	Add(rs []buckets.Reading, seq uint64, lo, hi buckets.Ticks)
	// Readings are the readings that won, each ticks once, in no
	// particular order.
	Readings() []buckets.Reading
}

// Ref is what a block's key says of it.
type Ref struct {
	Newest, Oldest buckets.Ticks
	Seq            uint64
	Count          int
	Sealed         bool
}

// Block is one block of a table, as Table.Blocks hands it out.
type Block struct {
	Ref      Ref
	Distinct bool // no two of its readings share a millisecond
	// Item is the block's entry; its key and version key the column
	// cache.
	Item *badger.Item
}

// scanners holds the block scanners of aggregates, so one reuses the
// buffers a previous one grew instead of growing its own.
var scanners = sync.Pool{New: func() any { return new(block.Scanner) }}

// Table adds the readings of t in [lo, hi), which lies in t's day.
// done says that the page is complete: more than Limit buckets are
// final.
//
// A first pass over the keys finds the blocks and which of them lie
// alone in one bucket; a second pass reads those from their headers in
// place, reads the other blocks that overlap no block column by column
// and decodes the rest into readings, each group of overlapping blocks
// resolved together.
func (a *Aggregator) Table(ctx context.Context, t Table, lo, hi buckets.Ticks) (done bool, err error) {
	if a.FinalBefore(a.BucketOf(lo)) > a.q.Limit {
		return true, nil
	}
	caching := a.caching()
	if caching && a.fromCachedList(t.Gen(), t.ReadTs(), lo, hi) {
		return false, nil
	}
	if a.first == nil {
		a.first, a.second, a.value = a.firstPass, a.secondPass, a.readBlock
	}
	p := &a.p
	*p = pass{ctx: ctx, t: t, lo: lo, hi: hi, caching: caching}
	defer func() { *p = pass{} }() // holds on to no table
	a.refs, a.distinct = a.refs[:0], a.distinct[:0]
	a.blockKeys, a.versions = a.blockKeys[:0], a.versions[:0]
	if caching {
		p.list = &BlockList{cover: lo}
	}
	if err := t.Blocks(lo, a.first); err != nil {
		return false, err
	}
	if p.list != nil {
		a.key = colcache.ListKey(a.key[:0], t.Gen(), t.ReadTs(), a.q.Device)
		a.cols.PutList(a.key, p.list, p.list.size())
	}
	if len(a.refs) == 0 {
		return false, nil
	}
	p.group = a.groups(a.refs, lo, hi)
	if caching && a.addAllCached(t.Gen(), p.group, lo, hi) {
		return false, nil
	}
	err = t.Blocks(lo, a.second) // meets the same blocks in the same order
	for _, r := range p.res {
		a.addReadings(r.Readings())
	}
	return false, err
}

// pass is the state of one Table call.
type pass struct {
	ctx     context.Context
	t       Table
	lo, hi  buckets.Ticks
	caching bool
	list    *BlockList       // with the cache: the blocks the first pass saw
	group   []int            // per block of the second pass: its group
	next    int              // the block of refs the second pass is at
	res     map[int]Resolver // per group of overlapping blocks
	g       int              // the group of the block being read
	bi      Block            // the block being read
}

// firstPass notes each block of the table that reaches below hi.
func (a *Aggregator) firstPass(bi Block) (bool, error) {
	p := &a.p
	if p.list != nil {
		p.list.add(bi)
	}
	if bi.Ref.Oldest < p.hi {
		a.refs = append(a.refs, bi.Ref)
		a.distinct = append(a.distinct, bi.Distinct)
		if p.list != nil { // the key the list copied, not a second copy
			lb := &p.list.blocks[len(p.list.blocks)-1]
			a.blockKeys, a.versions = append(a.blockKeys, lb.key), append(a.versions, lb.version)
		}
	}
	return true, nil
}

// secondPass reads each block the first pass noted, as its group says.
func (a *Aggregator) secondPass(bi Block) (bool, error) {
	p := &a.p
	if err := p.ctx.Err(); err != nil { // every block: a wide device's block takes long
		return false, err
	}
	if bi.Ref.Oldest >= p.hi {
		return true, nil
	}
	if p.next >= len(a.refs) || a.refs[p.next] != bi.Ref {
		return false, fmt.Errorf("block %s..%s: not seen by the first pass", bi.Ref.Oldest.FormatTime(), bi.Ref.Newest.FormatTime())
	}
	g := p.group[p.next]
	p.next++
	if (g == alone || g == whole) && a.addCached(p.t.Gen(), bi, g == whole, p.lo, p.hi) {
		return true, nil
	}
	p.g, p.bi = g, bi
	err := p.t.Value(bi, a.value)
	if p.t.Skip(p.ctx, err) {
		return true, p.ctx.Err()
	}
	return true, err
}

// readBlock adds the bytes v of the block the second pass is at.
func (a *Aggregator) readBlock(v []byte) error {
	p := &a.p
	g, bi := p.g, p.bi
	if g == whole {
		if err := a.AddHeader(bi.Ref, v); err != nil {
			return err
		}
		if p.caching {
			a.cachePending(p.t.Gen(), bi, true)
		}
		return nil
	}
	if g == alone {
		return a.addColumns(p.t.Gen(), bi, v, p.lo, p.hi)
	}
	_, rs, err := block.Decode(v, a.q.Device)
	if err != nil {
		return err
	}
	a.decoded++
	if p.res == nil {
		p.res = make(map[int]Resolver)
	}
	if p.res[g] == nil {
		p.res[g] = p.t.Resolver()
	}
	p.res[g].Add(rs, bi.Ref.Seq, p.lo, p.hi)
	return nil
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
func (a *Aggregator) groups(refs []Ref, lo, hi buckets.Ticks) []int {
	order := slices.Grow(a.order[:0], len(refs))
	for i := range refs {
		order = append(order, i)
	}
	a.order = order
	slices.SortFunc(order, func(x, y int) int { return cmp.Compare(refs[x].Oldest, refs[y].Oldest) })
	group := slices.Grow(a.group[:0], len(refs))[:len(refs)]
	a.group = group
	// Per millisecond, blocks that share a millisecond are resolved
	// together too.
	grain := buckets.Ticks(1)
	if a.q.PerMillisecond {
		grain = ticksPerMs
	}
	for i := 0; i < len(order); {
		n, end := 1, refs[order[i]].Newest
		for i+n < len(order) && refs[order[i+n]].Oldest/grain <= end/grain {
			end = max(end, refs[order[i+n]].Newest)
			n++
		}
		for _, x := range order[i : i+n] {
			group[x] = i
		}
		r := refs[order[i]]
		switch {
		case n > 1:
		case a.q.PerMillisecond && r.Count > 1 && !a.distinct[order[i]]:
			// Its header may count two readings of one millisecond.
			group[order[i]] = alone
		case r.Oldest >= lo && r.Newest < hi && a.BucketOf(r.Oldest) == a.BucketOf(r.Newest):
			group[order[i]] = whole
		default:
			group[order[i]] = alone
		}
		i += n
	}
	return group
}

// AddHeader adds the block v of ref, which lies in one bucket and
// overlaps no other block, from its header. With the column cache, the
// summaries of the wanted names are left in a.pending for cachePending.
func (a *Aggregator) AddHeader(ref Ref, v []byte) error {
	start := a.BucketOf(ref.Oldest)
	caching := a.caching()
	a.pending = a.pending[:0]
	_, _, err := block.EachSummary(v, func(name []byte, sum buckets.Summary) {
		if s := a.Summary(start, name); s != nil {
			s.Merge(sum)
			if caching {
				a.pending = append(a.pending, pendingColumn{name, &colcache.Column{Summary: sum}})
			}
		}
	})
	if err != nil {
		return err
	}
	a.headers++
	return nil
}

// addColumns adds the numeric values in [lo, hi) of a block that
// overlaps no other block, column by column: every (device, ticks) is
// in it once, so nothing needs resolving. When the query names its
// values, the columns it read (and an empty one for each name the block
// lacks) go into the column cache once the whole block read cleanly.
func (a *Aggregator) addColumns(gen uint64, bi Block, v []byte, lo, hi buckets.Ticks) error {
	if a.scan == nil {
		a.scan = scanners.Get().(*block.Scanner)
	}
	caching := a.caching()
	distinct := bi.Distinct
	a.pending = a.pending[:0]
	err := a.scan.Numeric(v, a.wants, func(name []byte, ticks []buckets.Ticks, vals []float64) {
		if caching {
			a.pending = append(a.pending, pendingColumn{name, colcache.Copy(ticks, vals)})
		}
		a.addColumn(name, ticks, vals, distinct, lo, hi)
	})
	if err != nil {
		return err
	}
	a.columns++
	if caching {
		a.cachePending(gen, bi, false)
	}
	return nil
}

// Note records that the block of ref, whose readings are distinct by
// millisecond or not, is among the blocks DistinctMs looks at.
func (a *Aggregator) Note(ref Ref, distinct bool) {
	a.refs, a.distinct = append(a.refs, ref), append(a.distinct, distinct)
}

// DistinctMs reports whether no two readings of the blocks that the
// last Table call saw (or Note was told of) in [lo, hi) share a
// millisecond: every such block says so of its own readings, and no two
// of them touch one millisecond.
func (a *Aggregator) DistinctMs(lo, hi buckets.Ticks) bool {
	var in []Ref
	for i, r := range a.refs {
		if r.Newest >= lo && r.Oldest < hi {
			if !a.distinct[i] && r.Count > 1 {
				return false
			}
			in = append(in, r)
		}
	}
	slices.SortFunc(in, func(x, y Ref) int { return int(x.Oldest - y.Oldest) })
	for i := 1; i < len(in); i++ {
		if in[i].Oldest/ticksPerMs <= in[i-1].Newest/ticksPerMs {
			return false
		}
	}
	return true
}
