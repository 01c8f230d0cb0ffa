package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/dgraph-io/badger/v4"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
	"github.com/telemetryd/telemetryd/store/devindex"
	"github.com/telemetryd/telemetryd/store/repair"
	"github.com/telemetryd/telemetryd/store/storemetrics"
)

// Inside a day table a device's readings are kept as blocks (package
// block), not one key per reading. A block's key is
//
//	<device> '/' <inverted newest ticks, 8 bytes> <oldest ticks, 8 bytes>
//	             <sequence, 8 bytes> <reading count | sealed bit, 2 bytes>
//
// all big-endian, so the first key of a device prefix is its newest
// block, and a key alone tells which time span a block covers, which
// write produced it (the sequence is the table version that committed
// it) and whether it still takes part in compaction (an open block) or
// is done (sealed).
//
// Blocks of one device may overlap in time: a commit writes one block
// per device touched, and a reading can arrive late or twice. A writer
// that stores a reading whose (device, ticks) may exist reads the stored
// one first and writes the whole merged reading, so among the blocks
// holding the same (device, ticks) the one with the highest sequence
// holds the answer. Readers resolve overlaps that way; the compactor
// (compact.go) merges a device's open blocks into sealed ones.

// A block's Badger entry carries flags in its user meta byte; a flag
// that is not set is unknown, never a promise:
//
//   - metaDistinctMs: no two readings of the block share a millisecond,
//     so its header summarises one value per millisecond too.
//
// Every block ends with a CRC-32C that every reader checks, and a
// block of any other version than block.Version is refused (package
// block), so a damaged block is never read unchecked.
const metaDistinctMs byte = 1

// blockMeta returns the user meta byte of the block of rs (sorted by
// ticks).
func blockMeta(rs []buckets.Reading) byte {
	for i := 1; i < len(rs); i++ {
		if rs[i].Ticks/ticksPerMs == rs[i-1].Ticks/ticksPerMs {
			return 0
		}
	}
	return metaDistinctMs
}

// blockKeyLen is the length of a block key after the device prefix.
const blockKeyLen = 8 + 8 + 8 + 2

// sealedBit marks a sealed block in the count field of its key.
const sealedBit = 1 << 15

// blockRef is what a block key says.
type blockRef struct {
	newest, oldest buckets.Ticks
	seq            uint64
	count          int
	sealed         bool
}

// overlaps reports whether the time spans of a and b intersect.
func (a blockRef) overlaps(b blockRef) bool {
	return a.oldest <= b.newest && b.oldest <= a.newest
}

// devicePrefix is the prefix "<device>/" of every block key of device
// in a table. Device IDs cannot contain '/', so it never matches a key
// of another device.
func devicePrefix(device buckets.DeviceID) []byte {
	p := make([]byte, 0, len(device)+1)
	return append(append(p, device...), '/')
}

// appendBlockKey appends the key of the block ref of dev to dst.
func appendBlockKey(dst []byte, dev buckets.DeviceID, ref blockRef) []byte {
	dst = append(dst, dev...)
	dst = append(dst, '/')
	dst = binary.BigEndian.AppendUint64(dst, ref.newest.Inverted())
	dst = binary.BigEndian.AppendUint64(dst, uint64(ref.oldest))
	dst = binary.BigEndian.AppendUint64(dst, ref.seq)
	c := uint16(ref.count)
	if ref.sealed {
		c |= sealedBit
	}
	return binary.BigEndian.AppendUint16(dst, c)
}

// parseBlockKey parses a key of the device whose prefix is prefixLen
// bytes long; ok is false for a key of another shape.
func parseBlockKey(key []byte, prefixLen int) (blockRef, bool) {
	if len(key) != prefixLen+blockKeyLen {
		return blockRef{}, false
	}
	k := key[prefixLen:]
	inv := binary.BigEndian.Uint64(k)
	oldest := binary.BigEndian.Uint64(k[8:])
	if inv > uint64(buckets.MaxTicks) || oldest > uint64(buckets.MaxTicks) {
		return blockRef{}, false
	}
	c := binary.BigEndian.Uint16(k[24:])
	ref := blockRef{
		newest: buckets.TicksFromInverted(inv), oldest: buckets.Ticks(oldest),
		seq: binary.BigEndian.Uint64(k[16:]), count: int(c &^ sealedBit), sealed: c&sealedBit != 0,
	}
	return ref, ref.oldest <= ref.newest
}

// parseAnyBlockKey splits a block key into device and block.
func parseAnyBlockKey(key []byte) (buckets.DeviceID, blockRef, bool) {
	n := len(key) - blockKeyLen - 1
	if n < 1 || key[n] != '/' {
		return "", blockRef{}, false
	}
	ref, ok := parseBlockKey(key, n+1)
	return buckets.DeviceID(key[:n]), ref, ok
}

// blockItem is a block found by eachBlock.
type blockItem struct {
	ref  blockRef
	item *badger.Item
}

// eachBlock calls fn for every block of dev in txn whose newest reading
// is not older than lo, newest block first, until fn returns false.
// Keys of another shape under the prefix are skipped.
func eachBlock(txn *badger.Txn, dev buckets.DeviceID, lo buckets.Ticks, fn func(blockItem) (bool, error)) error {
	it := newBlockIterator(txn, dev)
	defer it.Close()
	return it.each(lo, fn)
}

// blockIterator walks the blocks of one device; each walk starts from
// its newest block again, so one iterator serves several passes.
type blockIterator struct {
	*badger.Iterator
	prefixLen int
}

// newBlockIterator returns an iterator over the blocks of dev in txn;
// Close it when done.
func newBlockIterator(txn *badger.Txn, dev buckets.DeviceID) blockIterator {
	prefix := devicePrefix(dev)
	return blockIterator{txn.NewIterator(badger.IteratorOptions{Prefix: prefix}), len(prefix)}
}

// each is eachBlock on the iterator's device.
func (it blockIterator) each(lo buckets.Ticks, fn func(blockItem) (bool, error)) error {
	for it.Rewind(); it.Valid(); it.Next() {
		ref, ok := parseBlockKey(it.Item().Key(), it.prefixLen)
		if !ok {
			continue
		}
		if ref.newest < lo {
			return nil
		}
		more, err := fn(blockItem{ref: ref, item: it.Item()})
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// decodeItem decodes the whole block of bi.
func decodeItem(bi blockItem, dev buckets.DeviceID) ([]buckets.Reading, error) {
	var rs []buckets.Reading
	err := bi.item.Value(func(v []byte) error {
		var err error
		_, rs, err = block.Decode(v, dev)
		return err
	})
	if err != nil {
		return nil, &blockError{ref: bi.ref, err: err}
	}
	return rs, nil
}

// scanners holds the block scanners of readers, so a query reuses the
// buffers a previous one grew instead of growing its own.
var scanners = sync.Pool{New: func() any { return new(block.Scanner) }}

// readItem returns the readings of the block of bi with lo <= ticks <
// hi, oldest first; when limit is positive only the newest limit of
// them (newest) or the oldest limit. Only those rows are decoded into
// readings.
func readItem(bi blockItem, dev buckets.DeviceID, lo, hi buckets.Ticks, limit int, newest bool, vals *[]buckets.Field) ([]buckets.Reading, error) {
	var rs []buckets.Reading
	err := bi.item.Value(func(v []byte) error {
		var err error
		rs, err = readBlock(v, dev, lo, hi, limit, newest, vals)
		return err
	})
	if err != nil {
		return nil, &blockError{ref: bi.ref, err: err}
	}
	return rs, nil
}

// readBlock is readItem on the bytes of a block. When vals is not nil
// the readings' values go into its free capacity (block.Scanner.ReadingsIn)
// and *vals is extended by them.
func readBlock(b []byte, dev buckets.DeviceID, lo, hi buckets.Ticks, limit int, newest bool, vals *[]buckets.Field) ([]buckets.Reading, error) {
	sc := scanners.Get().(*block.Scanner)
	defer scanners.Put(sc)
	if vals == nil {
		return sc.Readings(b, dev, lo, hi, limit, newest)
	}
	rs, vs, err := sc.ReadingsIn(*vals, b, dev, lo, hi, limit, newest)
	*vals = vs
	return rs, err
}

// A stored block that fails its checksum or does not decode (a flipped
// bit on disk, a block of a version this build does not know) is never
// decoded into values and never fails a query: readers skip it, the
// answer carries a warning naming its day, device and key
// (buckets.Warn), and the first time this process meets it, it is
// logged and counted in telemetry.store.corrupt_blocks. Writes that
// merge into a reading of such a block write the new values without the
// lost ones; the compactor leaves the device's blocks as they are.
// `telemetryd check` (Store.Check) lists every such block.
//
// A block is refused before any of its values is read.

// BadBlock is a stored block that failed its checksum or its decoding.
type BadBlock = repair.BadBlock

// blockError is the error of a stored block that could not be read.
type blockError struct {
	ref blockRef
	err error
}

func (e *blockError) Error() string {
	return fmt.Sprintf("block %s..%s: %v", e.ref.oldest.FormatTime(), e.ref.newest.FormatTime(), e.err)
}

func (e *blockError) Unwrap() error { return e.err }

// badBlockOf returns the error of a block whose bytes are damaged or of
// an unknown version, or nil for any other error (a Badger failure, a
// cancelled context), which readers pass on.
func badBlockOf(err error) *blockError {
	if err == nil {
		return nil // before errors.As, whose target escapes: no allocation per block read
	}
	var be *blockError
	if errors.As(err, &be) && (errors.Is(be.err, block.ErrCorrupt) || errors.Is(be.err, block.ErrVersion)) {
		return be
	}
	return nil
}

// maxRememberedBadBlocks bounds the set of bad blocks already logged
// and counted; past it, they are logged and counted again.
const maxRememberedBadBlocks = 4096

// badBlocks reports the bad blocks readers meet.
type badBlocks struct {
	counter metric.Int64Counter
	log     *slog.Logger

	mu   sync.Mutex
	seen map[string]struct{} // day and key of each block logged and counted
}

// skip reports the bad block of e (of dev in the table of day) and says
// whether the reader should skip it: false when err is no bad block.
func (b *badBlocks) skip(ctx context.Context, day buckets.Day, dev buckets.DeviceID, err error) bool {
	e := badBlockOf(err)
	if e == nil || b == nil {
		return e != nil
	}
	bb := BadBlock{Day: day, Device: dev, Key: appendBlockKey(nil, dev, e.ref),
		Oldest: e.ref.oldest, Newest: e.ref.newest, Err: e.err}
	buckets.Warn(ctx, fmt.Sprintf("skipped a corrupt block: %s: %v", bb, e.err))
	if b.first(bb) {
		b.counter.Add(context.Background(), 1, storemetrics.KindBlock)
		b.log.Error("stored block is corrupt; queries skip it and warn", "day", day.String(),
			"device", string(dev), "key", fmt.Sprintf("%x", bb.Key), "err", e.err)
	}
	return true
}

// first reports whether bb is met for the first time.
func (b *badBlocks) first(bb BadBlock) bool {
	id := bb.Day.String() + "/" + string(bb.Key)
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen[id]; ok {
		return false
	}
	if len(b.seen) >= maxRememberedBadBlocks {
		clear(b.seen)
	}
	b.seen[id] = struct{}{}
	return true
}

// start sets the counter and exports it at zero, so that dashboards and
// alerts see the series before the first corrupt block.
func (b *badBlocks) start(c metric.Int64Counter) {
	b.counter = c
	c.Add(context.Background(), 0, storemetrics.KindBlock)
	c.Add(context.Background(), 0, storemetrics.KindRecord)
}

// damagedRecords reports the device index records that failed their
// checksum or decoding when the index was loaded.
func (b *badBlocks) damagedRecords(recs []devindex.Damaged) {
	for _, r := range recs {
		b.counter.Add(context.Background(), 1, storemetrics.KindRecord)
		b.log.Error("device index record is corrupt; the device is left out of the index until a writable start rebuilds it from the day tables",
			"device", string(r.Device), "err", r.Err)
	}
}
