// Package colcache keeps decoded value columns of stored blocks in
// memory, so that a question asked again (a dashboard refreshing, an
// alert rule evaluated every minute) folds the values it needs instead
// of decompressing every block that holds them once more.
//
// A column is the ticks and numeric values of one value name in one
// block, as block.Scanner.Numeric hands them out. It is cached under a
// key that names the exact bytes it was decoded from: the opening of
// the day table's database (a number the store gives each opening), the
// version Badger gave the block's key when it was committed, and the
// block's key. A commit never reuses a version within one opening, so a
// rewritten block (a merge, a compaction, a late reading) has a new
// version and its old columns are simply no longer asked for; they age
// out. Nothing is ever invalidated, and nothing stale can be returned.
//
// The cache is bounded by bytes (ristretto, with its admission policy
// keeping the columns asked for most often when it is full). A value
// name the block does not hold is cached too, as an empty column, so a
// fully cached block is answered without reading it at all.
//
// A column also keeps its values folded into the buckets of the last
// width an aggregate asked for (Fold), so that a question asked again
// over the same buckets merges a few summaries per block; the cache
// accounts for a fold's memory when it admits the column.
//
// The cache also holds lists of a device's blocks in a table as a read
// at one table version saw them (the store's type L): a version is a
// snapshot that never changes, so while no commit touches the table
// (a day that is no longer written, or a quiet hour) a question asked
// again needs neither a Badger iterator nor a block.
package colcache

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/telemetryd/telemetryd/buckets"
)

// Column is one value name's numeric values in one block, oldest
// first; or, cached under a HeaderKey, only the summary of them the
// block's header holds (its Count 0 when the block has none). It is
// shared by every reader that gets it: never modify it.
type Column struct {
	Ticks   []buckets.Ticks
	Vals    []float64
	Summary buckets.Summary
	fold    atomic.Pointer[Fold] // the values folded into buckets of one width, once asked
}

// Fold is a column's values folded into the buckets of one width: per
// bucket that holds values, oldest first, its start, the summary of
// its values and where they lie in the column. A question asked again
// over the same buckets (a dashboard panel, a rule, a subquery's
// windows) merges a handful of summaries per block instead of folding
// every value.
type Fold struct {
	Interval buckets.Ticks
	Buckets  []FoldBucket
}

// FoldBucket is one bucket of a Fold: Summary summarises
// Vals[Lo:Hi], the values whose ticks are in the bucket starting at
// Start.
type FoldBucket struct {
	Start   buckets.Ticks
	Lo, Hi  int32
	Summary buckets.Summary
}

// MinValuesPerBucket is the fewest values per bucket, on average, for
// which a column keeps a fold: a fold of narrower buckets costs about
// as much to merge as the values do to fold, and would take more
// memory than the cache accounts for it.
const MinValuesPerBucket = 16

// foldBytes is the memory a column accounts for its fold: at most one
// FoldBucket per MinValuesPerBucket values.
func foldBytes(values int) int {
	return int(unsafe.Sizeof(FoldBucket{})) * (values/MinValuesPerBucket + 1)
}

// Fold returns the fold kept with the column for buckets of width
// interval, or nil.
func (c *Column) Fold(interval buckets.Ticks) *Fold {
	if f := c.fold.Load(); f != nil && f.Interval == interval {
		return f
	}
	return nil
}

// KeepFold keeps f with the column, in place of a fold of another
// width, when it has at most one bucket per MinValuesPerBucket values
// (else it is not kept); f must not be changed afterwards. Two readers
// may keep equal folds at once: either stays.
func (c *Column) KeepFold(f *Fold) {
	if len(f.Buckets) <= len(c.Vals)/MinValuesPerBucket+1 {
		c.fold.Store(f)
	}
}

// entryOverhead is what a cached column costs beyond its values: the
// Column and its slice headers, the key, and ristretto's bookkeeping.
const entryOverhead = 160

// avgEntryBytes is the size of a typical column (an hour of readings
// every 10 s), used to size ristretto's admission counters.
const avgEntryBytes = 6 << 10

// Cache holds decoded columns and block lists of type L up to a number
// of bytes. A nil *Cache caches nothing: lookups miss and puts do
// nothing.
type Cache[L any] struct {
	c            *ristretto.Cache[string, entry[L]]
	hits, misses atomic.Int64
}

// entry is a column or a block list.
type entry[L any] struct {
	col  *Column
	list L
}

// Tags that keep the keys of columns and of lists apart.
const (
	tagColumn = 'c'
	tagHeader = 'h'
	tagList   = 'l'
)

// New returns a cache of at most maxBytes bytes (at least 1 MiB).
func New[L any](maxBytes int64) (*Cache[L], error) {
	if maxBytes < 1<<20 {
		return nil, fmt.Errorf("column cache of %d bytes: at least 1 MiB", maxBytes)
	}
	c, err := ristretto.NewCache(&ristretto.Config[string, entry[L]]{
		NumCounters: max(10*maxBytes/avgEntryBytes, 1000),
		MaxCost:     maxBytes,
		BufferItems: 64,
	})
	if err != nil {
		return nil, fmt.Errorf("column cache: %w", err)
	}
	return &Cache[L]{c: c}, nil
}

// Key appends to dst the key of the column of name in the block stored
// under blockKey at version in the table opening gen.
func Key[K ~string | ~[]byte](dst []byte, gen, version uint64, blockKey K, name []byte) []byte {
	return blockName(append(dst, tagColumn), gen, version, blockKey, name)
}

// HeaderKey is Key for the header summary of name in the block: what
// an aggregate needs of a block that lies inside one of its buckets.
func HeaderKey[K ~string | ~[]byte](dst []byte, gen, version uint64, blockKey K, name []byte) []byte {
	return blockName(append(dst, tagHeader), gen, version, blockKey, name)
}

// blockName appends the identity of name in a block.
func blockName[K ~string | ~[]byte](dst []byte, gen, version uint64, blockKey K, name []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, gen)
	dst = binary.BigEndian.AppendUint64(dst, version)
	dst = binary.AppendUvarint(dst, uint64(len(blockKey)))
	dst = append(dst, blockKey...)
	return append(dst, name...)
}

// ListKey appends to dst the key of the block list of device read at
// readTs in the table opening gen.
func ListKey[D ~string | ~[]byte](dst []byte, gen, readTs uint64, device D) []byte {
	dst = append(dst, tagList)
	dst = binary.BigEndian.AppendUint64(dst, gen)
	dst = binary.BigEndian.AppendUint64(dst, readTs)
	return append(dst, device...)
}

// Get returns the column cached under key.
func (c *Cache[L]) Get(key []byte) (*Column, bool) {
	e, ok := c.get(key)
	ok = c.count(ok && e.col != nil)
	return e.col, ok
}

// GetList returns the block list cached under key.
func (c *Cache[L]) GetList(key []byte) (L, bool) {
	e, ok := c.get(key)
	return e.list, c.count(ok && e.col == nil)
}

// get looks key up.
func (c *Cache[L]) get(key []byte) (entry[L], bool) {
	if c == nil {
		return entry[L]{}, false
	}
	return c.c.Get(string(key))
}

// count counts a lookup that found (hit) or did not find what it
// looked for, and returns hit.
func (c *Cache[L]) count(hit bool) bool {
	switch {
	case c == nil:
	case hit:
		c.hits.Add(1)
	default:
		c.misses.Add(1)
	}
	return hit
}

// Copy returns a column holding copies of ticks and vals (none: the
// block holds no numeric value of the name).
func Copy(ticks []buckets.Ticks, vals []float64) *Column {
	col := &Column{}
	if len(vals) > 0 {
		col.Ticks, col.Vals = append([]buckets.Ticks(nil), ticks...), append([]float64(nil), vals...)
	}
	return col
}

// Put caches col under key; the cache may decline it. col must not be
// changed afterwards.
func (c *Cache[L]) Put(key []byte, col *Column) {
	if c == nil {
		return
	}
	cost := entryOverhead + len(key)
	if len(col.Vals) > 0 {
		cost += 16*len(col.Vals) + foldBytes(len(col.Vals))
	}
	c.c.Set(string(key), entry[L]{col: col}, int64(cost))
}

// PutList caches list, of about size bytes, under key; the cache may
// decline it. list must not be changed afterwards.
func (c *Cache[L]) PutList(key []byte, list L, size int) {
	if c == nil {
		return
	}
	c.c.Set(string(key), entry[L]{list: list}, int64(entryOverhead+len(key)+size))
}

// Stats returns how many lookups (of columns and lists) found what
// they looked for and how many did not.
func (c *Cache[L]) Stats() (hits, misses int64) {
	if c == nil {
		return 0, 0
	}
	return c.hits.Load(), c.misses.Load()
}

// Wait blocks until the columns put so far are in the cache or
// declined (ristretto admits them in the background).
func (c *Cache[L]) Wait() {
	if c != nil {
		c.c.Wait()
	}
}

// Close releases the cache's goroutines and memory.
func (c *Cache[L]) Close() {
	if c != nil {
		c.c.Close()
	}
}
