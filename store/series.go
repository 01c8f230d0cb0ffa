package store

import (
	"encoding/binary"
	"sync"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
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
