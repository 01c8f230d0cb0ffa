package devindex

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// maxLatestNames bounds how many value names the index remembers per
// device; past it the name updated longest ago is forgotten.
const maxLatestNames = 4 * buckets.MaxValues

// Index knows every device the store has seen: first and last reading
// time and the newest value of every name. It lives in memory and in
// its own small Badger database, which day drops never touch.
//
// Updates that move a device's first or last day (and new devices) are
// persisted (Persist) before the store's Write returns, because queries
// use those bounds to skip tables: after a crash they are never too
// narrow. Other updates
// (a newer last-seen time or value within the same days) are persisted
// by Flush, which the store calls on a timer and on Close; after a
// crash they may lag until the unacknowledged messages are delivered
// again.
type Index struct {
	db *badger.DB

	mu      sync.RWMutex
	devices map[buckets.DeviceID]*deviceEntry
	sorted  []buckets.DeviceID // the keys of devices, ascending
	dirty   map[buckets.DeviceID]struct{}

	persistMu sync.Mutex // orders persists so newer state always lands last

	// damaged lists the records load left out: the store rebuilds the
	// index from the day tables when there are any.
	damaged []Damaged

	// postings are the devices of every attribute name and value
	// (attrpostings.go); attrLocks order attribute changes per device;
	// attrDamaged lists the attribute records load rebuilt.
	postings    attrPostings
	attrLocks   attrLocks
	attrDamaged []Damaged
	// attrGen counts the changes of devices' attribute sets
	// (AttributeGeneration).
	attrGen atomic.Uint64
}

// Damaged is a device record or attribute record that failed its
// checksum or its decoding.
type Damaged struct {
	Device buckets.DeviceID
	Err    error
}

// deviceEntry is what the index knows about one device.
type deviceEntry struct {
	first, last buckets.Ticks
	latest      []buckets.Field // sorted by name
	at          []buckets.Ticks // time of each latest value
	attrs       *attrRecord     // nil: no attribute was ever assigned
}

// Load reads the index held in db, which the caller opened and closes
// after a last Flush. Device records that fail their checksum are left
// out and listed by Damaged; damaged attribute records are rebuilt from
// the device's index entities and listed by AttrDamaged, and when the
// entities disagree with the records an index not readOnly rewrites
// them.
func Load(db *badger.DB, readOnly bool, log *slog.Logger) (*Index, error) {
	idx := &Index{
		db:      db,
		devices: make(map[buckets.DeviceID]*deviceEntry),
		dirty:   make(map[buckets.DeviceID]struct{}),
	}
	if err := idx.load(); err != nil {
		return nil, fmt.Errorf("load device index: %w", err)
	}
	if err := idx.loadAttributes(readOnly, log); err != nil {
		return nil, fmt.Errorf("load device attributes: %w", err)
	}
	return idx, nil
}

// DB is the index database, which also holds what the store keeps
// beside the index (such as its device tombstones, under keys that
// sort before the device records).
func (x *Index) DB() *badger.DB { return x.db }

// Damaged lists the device records Load left out.
func (x *Index) Damaged() []Damaged { return x.damaged }

// AttrDamaged lists the attribute records Load rebuilt (it logged
// them).
func (x *Index) AttrDamaged() []Damaged { return x.attrDamaged }

// load reads every device record (the keys from deviceKeysStart on;
// the attribute data sorts before them). A record that fails its checksum or
// does not decode is left out and listed in x.damaged.
func (x *Index) load() error {
	return x.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Seek(deviceKeysStart); it.Valid(); it.Next() {
			item := it.Item()
			dev := buckets.DeviceID(item.KeyCopy(nil))
			err := item.Value(func(v []byte) error {
				e, err := decodeEntry(v)
				if err != nil {
					x.damaged = append(x.damaged, Damaged{Device: dev, Err: err})
					return nil
				}
				x.devices[dev] = e
				x.sorted = append(x.sorted, dev)
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// Len is the number of known devices.
func (x *Index) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.devices)
}

// Observe records committed readings. It returns the devices whose
// record must be persisted (Persist) before the write is acknowledged.
func (x *Index) Observe(rs []buckets.Reading) []buckets.DeviceID {
	x.mu.Lock()
	defer x.mu.Unlock()
	var urgent []buckets.DeviceID
	mark := func(d buckets.DeviceID) {
		if !slices.Contains(urgent, d) {
			urgent = append(urgent, d)
		}
	}
	for i := range rs {
		r := &rs[i]
		e := x.devices[r.Device]
		switch {
		case e == nil:
			e = &deviceEntry{first: r.Ticks, last: r.Ticks}
			x.devices[r.Device] = e
			at, _ := slices.BinarySearch(x.sorted, r.Device)
			x.sorted = slices.Insert(x.sorted, at, r.Device)
			mark(r.Device)
		case e.first == 0 && e.last == 0:
			// Known only by its attributes until now.
			e.first, e.last = r.Ticks, r.Ticks
			mark(r.Device)
		case r.Ticks < e.first:
			if buckets.DayOf(r.Ticks) != buckets.DayOf(e.first) {
				mark(r.Device)
			}
			e.first = r.Ticks
		case r.Ticks > e.last:
			if buckets.DayOf(r.Ticks) != buckets.DayOf(e.last) {
				mark(r.Device)
			}
			e.last = r.Ticks
		}
		e.update(r)
		x.dirty[r.Device] = struct{}{}
	}
	return urgent
}

// update keeps, for every name of r, the value of the newest reading.
// At equal times the later write wins, as in a merge.
func (e *deviceEntry) update(r *buckets.Reading) {
	if e.updateSameNames(r) {
		return
	}
	for _, f := range r.Values {
		i, found := slices.BinarySearchFunc(e.latest, f.Name, func(a buckets.Field, name string) int {
			return strings.Compare(a.Name, name)
		})
		switch {
		case !found:
			e.latest = slices.Insert(e.latest, i, f)
			e.at = slices.Insert(e.at, i, r.Ticks)
		case r.Ticks >= e.at[i]:
			e.latest[i].Value = f.Value
			e.at[i] = r.Ticks
		}
	}
	for len(e.latest) > maxLatestNames {
		oldest := 0
		for i, k := range e.at {
			if k < e.at[oldest] {
				oldest = i
			}
		}
		e.latest = slices.Delete(e.latest, oldest, oldest+1)
		e.at = slices.Delete(e.at, oldest, oldest+1)
	}
}

// updateSameNames is update's fast path for the common case: r has
// exactly the names e keeps, in the same (sorted) order, so each value
// lands at its own index without a search. It reports false, changing
// nothing, when the names differ.
func (e *deviceEntry) updateSameNames(r *buckets.Reading) bool {
	if len(r.Values) != len(e.latest) {
		return false
	}
	for i := range r.Values {
		if r.Values[i].Name != e.latest[i].Name {
			return false
		}
	}
	for i, f := range r.Values {
		if r.Ticks >= e.at[i] {
			e.latest[i].Value = f.Value
			e.at[i] = r.Ticks
		}
	}
	return true
}

// Flush persists every record changed since its last persist.
func (x *Index) Flush() error {
	x.mu.RLock()
	ids := make([]buckets.DeviceID, 0, len(x.dirty))
	for d := range x.dirty {
		ids = append(ids, d)
	}
	x.mu.RUnlock()
	return x.Persist(ids)
}

// Persist writes the current records of ids.
func (x *Index) Persist(ids []buckets.DeviceID) error {
	if len(ids) == 0 {
		return nil
	}
	x.persistMu.Lock()
	defer x.persistMu.Unlock()
	x.mu.Lock()
	keys := make([]buckets.DeviceID, 0, len(ids))
	recs := make([][]byte, 0, len(ids))
	for _, d := range ids {
		if e := x.devices[d]; e != nil { // else deleted (DeleteDevice)
			keys = append(keys, d)
			recs = append(recs, encodeEntry(nil, e))
		}
		delete(x.dirty, d)
	}
	x.mu.Unlock()

	wb := x.db.NewWriteBatch()
	defer wb.Cancel()
	err := func() error {
		for i, d := range keys {
			if err := wb.Set([]byte(d), recs[i]); err != nil {
				return err
			}
		}
		return wb.Flush()
	}()
	if err != nil {
		x.mu.Lock()
		for _, d := range keys {
			x.dirty[d] = struct{}{}
		}
		x.mu.Unlock()
		return fmt.Errorf("persist device index: %w", err)
	}
	return nil
}

// Bounds returns the first and last reading time of dev; ok is false
// when the index does not know dev.
func (x *Index) Bounds(dev buckets.DeviceID) (first, last buckets.Ticks, ok bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	e := x.devices[dev]
	if e == nil {
		return 0, 0, false
	}
	return e.first, e.last, true
}

// DeleteDevice removes dev's record, attribute record and index
// entities from the index database in one transaction, then from
// memory.
func (x *Index) DeleteDevice(dev buckets.DeviceID) error {
	for _, i := range stripes([]buckets.DeviceID{dev}) {
		x.attrLocks[i].Lock()
		defer x.attrLocks[i].Unlock()
	}
	// No persist may write the record back after it is deleted.
	x.persistMu.Lock()
	defer x.persistMu.Unlock()
	x.mu.RLock()
	var set buckets.Attributes
	if e := x.devices[dev]; e != nil {
		set = e.attributes()
	}
	x.mu.RUnlock()
	_, del := attrChanges(dev, set, nil)
	del = append(del, AttrRecordKey(dev), []byte(dev))
	err := x.db.Update(func(txn *badger.Txn) error {
		for _, k := range del {
			if err := txn.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete the index record and attributes: %w", err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if e := x.devices[dev]; e != nil {
		x.postings.change(dev, e, e.attributes(), nil)
		x.attrGen.Add(1)
	}
	delete(x.devices, dev)
	delete(x.dirty, dev)
	if i, ok := slices.BinarySearch(x.sorted, dev); ok {
		x.sorted = slices.Delete(x.sorted, i, i+1)
	}
	return nil
}

// Record encoding, version 6:
//
//	version byte (6)
//	uvarint first ticks, uvarint last ticks
//	uvarint n, then n uvarint times (one per latest value)
//	the latest values as AppendValues writes them (values.go)
//	CRC-32C (Castagnoli) of all the bytes before it, 4 bytes big-endian
const entryVersion = 6

func encodeEntry(dst []byte, e *deviceEntry) []byte {
	start := len(dst)
	dst = append(dst, entryVersion)
	dst = binary.AppendUvarint(dst, uint64(e.first))
	dst = binary.AppendUvarint(dst, uint64(e.last))
	dst = binary.AppendUvarint(dst, uint64(len(e.at)))
	for _, k := range e.at {
		dst = binary.AppendUvarint(dst, uint64(k))
	}
	dst = AppendValues(dst, e.latest)
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// castagnoli is the CRC-32C table (hardware-accelerated where the CPU
// has the instruction).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// entryBody checks the version and checksum of a device record and
// returns the bytes between them.
func entryBody(b []byte) ([]byte, error) {
	if len(b) == 0 {
		return nil, errors.New("corrupt device record: empty")
	}
	if b[0] != entryVersion {
		return nil, fmt.Errorf("corrupt device record: unknown version %d", b[0])
	}
	n := len(b) - 4
	if n < 1 {
		return nil, errors.New("corrupt device record: too short for a checksum")
	}
	if stored, sum := binary.BigEndian.Uint32(b[n:]), crc32.Checksum(b[:n], castagnoli); stored != sum {
		return nil, fmt.Errorf("corrupt device record: checksum mismatch (stored %08x, computed %08x)", stored, sum)
	}
	return b[1:n], nil
}

func decodeEntry(b []byte) (*deviceEntry, error) {
	errBad := errors.New("corrupt device record")
	b, err := entryBody(b)
	if err != nil {
		return nil, err
	}
	next := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			b = nil
			return 0
		}
		b = b[n:]
		return v
	}
	e := &deviceEntry{first: buckets.Ticks(next()), last: buckets.Ticks(next())}
	n := next()
	if n > maxLatestNames || b == nil {
		return nil, errBad
	}
	e.at = make([]buckets.Ticks, n)
	for i := range e.at {
		e.at[i] = buckets.Ticks(next())
	}
	fields, err := decodeValues(b)
	if err != nil || uint64(len(fields)) != n {
		return nil, errBad
	}
	e.latest = fields
	return e, nil
}
