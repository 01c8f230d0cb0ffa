package devindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"

	"github.com/telemetryd/telemetryd/buckets"
)

// maxTombstones bounds how many removed attribute names a device's
// record remembers. Past it the oldest removal is forgotten and its
// time folded into the record's floor, so it still wins against older
// assignments (together with every other absent name: the bound errs
// on the side of never rolling an attribute back).
const maxTombstones = 64

// Key prefixes of the attribute data in the device index database.
// Device records are keyed by the device ID alone, which starts with a
// letter or digit, so these sort before every device record.
const (
	attrRecordPrefix = 0x01 // 0x01 <device> -> attribute record
	attrEntityPrefix = 0x02 // 0x02 <name> 0x00 <value> 0x00 <device> -> empty
)

// deviceKeysStart is where the device records begin in the index
// database: the smallest byte a device ID may start with.
var deviceKeysStart = []byte{'0'}

// attrRecord is one device's attributes with the times that decide
// which later assignments win.
//
// A name's state is either a value set at some time or removed at some
// time. A present name carries its own time. An absent name counts as
// removed at its tombstone's time when it has one, else at floor (the
// newest replacement of the whole set, or a forgotten tombstone). An
// assignment wins when it is newer; at equal times a value beats a
// removal and the greater value beats the smaller, so the outcome does
// not depend on the order assignments arrive in.
type attrRecord struct {
	floor buckets.Ticks
	set   buckets.Attributes // sorted by name
	at    []buckets.Ticks    // the time of each value in set
	gone  []tombstone        // sorted by name, each newer than floor
}

// tombstone remembers when a name was removed.
type tombstone struct {
	name string
	at   buckets.Ticks
}

// clone returns a deep enough copy to change without touching r (the
// strings are shared; they never change).
func (r *attrRecord) clone() *attrRecord {
	if r == nil {
		return &attrRecord{}
	}
	return &attrRecord{floor: r.floor, set: slices.Clone(r.set), at: slices.Clone(r.at), gone: slices.Clone(r.gone)}
}

func (r *attrRecord) find(name string) (int, bool) {
	return slices.BinarySearchFunc(r.set, name, func(a buckets.Attribute, n string) int { return strings.Compare(a.Name, n) })
}

func (r *attrRecord) findGone(name string) (int, bool) {
	return slices.BinarySearchFunc(r.gone, name, func(t tombstone, n string) int { return strings.Compare(t.name, n) })
}

// removedAt is when the absent name was removed.
func (r *attrRecord) removedAt(name string) buckets.Ticks {
	if j, ok := r.findGone(name); ok {
		return max(r.floor, r.gone[j].at)
	}
	return r.floor
}

// apply applies a to r and reports whether r changed.
func (r *attrRecord) apply(a *buckets.Assignment) bool {
	changed := false
	for _, x := range a.Set {
		changed = r.setValue(x.Name, x.Value, a.At) || changed
	}
	for _, name := range a.Remove {
		changed = r.remove(name, a.At) || changed
	}
	if a.Replace {
		changed = r.replace(a.Set, a.At) || changed
	}
	return r.boundTombstones() || changed
}

// setValue sets name to value as of at, unless the name's state is
// newer.
func (r *attrRecord) setValue(name, value string, at buckets.Ticks) bool {
	i, ok := r.find(name)
	if ok {
		if at < r.at[i] || at == r.at[i] && value <= r.set[i].Value {
			return false
		}
		r.set[i].Value, r.at[i] = value, at
		return true
	}
	if at < r.removedAt(name) {
		return false
	}
	r.set = slices.Insert(r.set, i, buckets.Attribute{Name: name, Value: value})
	r.at = slices.Insert(r.at, i, at)
	if j, ok := r.findGone(name); ok {
		r.gone = slices.Delete(r.gone, j, j+1)
	}
	return true
}

// remove removes name as of at, unless the name's state is newer or as
// new.
func (r *attrRecord) remove(name string, at buckets.Ticks) bool {
	if i, ok := r.find(name); ok {
		if at <= r.at[i] {
			return false
		}
		r.set = slices.Delete(r.set, i, i+1)
		r.at = slices.Delete(r.at, i, i+1)
	} else if at <= r.removedAt(name) {
		return false
	}
	if at <= r.floor {
		return true
	}
	j, ok := r.findGone(name)
	if ok {
		r.gone[j].at = at
	} else {
		r.gone = slices.Insert(r.gone, j, tombstone{name: name, at: at})
	}
	return true
}

// replace removes, as of at, every name not in keep, and raises the
// floor to at so older assignments of any absent name lose.
func (r *attrRecord) replace(keep buckets.Attributes, at buckets.Ticks) bool {
	changed := false
	for i := 0; i < len(r.set); {
		if _, kept := keep.Get(r.set[i].Name); kept || r.at[i] >= at {
			i++
			continue
		}
		r.set = slices.Delete(r.set, i, i+1)
		r.at = slices.Delete(r.at, i, i+1)
		changed = true
	}
	if at > r.floor {
		r.floor = at
		r.dropBuriedTombstones()
		changed = true
	}
	return changed
}

// boundTombstones forgets the oldest tombstones past maxTombstones,
// folding their times into the floor.
func (r *attrRecord) boundTombstones() bool {
	changed := false
	for len(r.gone) > maxTombstones {
		oldest := r.gone[0].at
		for _, t := range r.gone {
			oldest = min(oldest, t.at)
		}
		r.floor = max(r.floor, oldest)
		r.dropBuriedTombstones()
		changed = true
	}
	return changed
}

// dropBuriedTombstones drops the tombstones the floor makes redundant.
func (r *attrRecord) dropBuriedTombstones() {
	r.gone = slices.DeleteFunc(r.gone, func(t tombstone) bool { return t.at <= r.floor })
}

// Attribute record encoding, version 1:
//
//	version byte (1)
//	uvarint floor ticks
//	uvarint n, then n times: uvarint name length, name,
//	    uvarint value length, value, uvarint ticks of the value
//	uvarint m, then m times: uvarint name length, name, uvarint ticks
//	    of the removal (the tombstones)
//	CRC-32C (Castagnoli) of all the bytes before it, 4 bytes big-endian
//
// Names are sorted in both lists.
const attrRecordVersion = 1

func encodeAttrRecord(dst []byte, r *attrRecord) []byte {
	start := len(dst)
	dst = append(dst, attrRecordVersion)
	dst = binary.AppendUvarint(dst, uint64(r.floor))
	dst = binary.AppendUvarint(dst, uint64(len(r.set)))
	for i, a := range r.set {
		dst = appendString(dst, a.Name)
		dst = appendString(dst, a.Value)
		dst = binary.AppendUvarint(dst, uint64(r.at[i]))
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.gone)))
	for _, t := range r.gone {
		dst = appendString(dst, t.name)
		dst = binary.AppendUvarint(dst, uint64(t.at))
	}
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// attrDecoder reads the fields of an attribute record.
type attrDecoder struct {
	b   []byte
	err error
}

var errBadAttrRecord = errors.New("corrupt attribute record")

func (d *attrDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err, d.b = errBadAttrRecord, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *attrDecoder) ticks() buckets.Ticks {
	v := d.uvarint()
	if v > uint64(buckets.MaxTicks) {
		d.err = errBadAttrRecord
	}
	return buckets.Ticks(v)
}

func (d *attrDecoder) string(maxLen int) string {
	n := d.uvarint()
	if n > uint64(maxLen) || n > uint64(len(d.b)) {
		d.err, d.b = errBadAttrRecord, nil
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// decodeAttrRecord checks the checksum of b and decodes it. It refuses
// a record that breaks any rule a record written by encodeAttrRecord
// keeps (limits, valid and sorted names, valid values).
func decodeAttrRecord(b []byte) (*attrRecord, error) {
	if len(b) < 5 {
		return nil, fmt.Errorf("%w: %d bytes is too short", errBadAttrRecord, len(b))
	}
	if b[0] != attrRecordVersion {
		return nil, fmt.Errorf("%w: unknown version %d", errBadAttrRecord, b[0])
	}
	n := len(b) - 4
	if stored, sum := binary.BigEndian.Uint32(b[n:]), crc32.Checksum(b[:n], castagnoli); stored != sum {
		return nil, fmt.Errorf("%w: checksum mismatch (stored %08x, computed %08x)", errBadAttrRecord, stored, sum)
	}
	d := &attrDecoder{b: b[1:n]}
	r := &attrRecord{floor: d.ticks()}
	if k := d.uvarint(); k <= buckets.MaxAttributes {
		for range k {
			name, value := d.string(buckets.MaxAttributeNameBytes), d.string(buckets.MaxAttributeValueBytes)
			r.set = append(r.set, buckets.Attribute{Name: name, Value: value})
			r.at = append(r.at, d.ticks())
		}
	} else {
		d.err = errBadAttrRecord
	}
	if k := d.uvarint(); k <= maxTombstones {
		for range k {
			r.gone = append(r.gone, tombstone{name: d.string(buckets.MaxAttributeNameBytes), at: d.ticks()})
		}
	} else {
		d.err = errBadAttrRecord
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d bytes left over", errBadAttrRecord, len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return r, r.validate()
}

// validate checks what decoding cannot: names and values follow the
// rules, the lists are sorted, and every tombstone is of an absent name
// and newer than the floor.
func (r *attrRecord) validate() error {
	for i, a := range r.set {
		if err := buckets.ValidateAttributeName(a.Name); err != nil {
			return fmt.Errorf("%w: %v", errBadAttrRecord, err)
		}
		if err := buckets.ValidateAttributeValue(a.Name, a.Value); err != nil {
			return fmt.Errorf("%w: %v", errBadAttrRecord, err)
		}
		if i > 0 && r.set[i-1].Name >= a.Name {
			return fmt.Errorf("%w: names out of order", errBadAttrRecord)
		}
	}
	for i, t := range r.gone {
		if err := buckets.ValidateAttributeName(t.name); err != nil {
			return fmt.Errorf("%w: %v", errBadAttrRecord, err)
		}
		if i > 0 && r.gone[i-1].name >= t.name {
			return fmt.Errorf("%w: removed names out of order", errBadAttrRecord)
		}
		if _, present := r.find(t.name); present || t.at <= r.floor {
			return fmt.Errorf("%w: tombstone of %s is present or not newer than the floor", errBadAttrRecord, t.name)
		}
	}
	return nil
}

// AttrRecordKey is the key of dev's attribute record in the index
// database.
func AttrRecordKey(dev buckets.DeviceID) []byte {
	return append([]byte{attrRecordPrefix}, dev...)
}

// EntityKey is the key of the index entity saying dev has name=value.
// A name and a device never hold a zero byte (a value may), so the
// name ends at the first zero byte and the device starts after the last.
func EntityKey(name, value string, dev buckets.DeviceID) []byte {
	k := make([]byte, 0, 3+len(name)+len(value)+len(dev))
	k = append(k, attrEntityPrefix)
	k = append(k, name...)
	k = append(k, 0)
	k = append(k, value...)
	k = append(k, 0)
	return append(k, dev...)
}

// parseEntityKey splits an index entity key.
func parseEntityKey(k []byte) (name, value string, dev buckets.DeviceID, ok bool) {
	if len(k) < 1 || k[0] != attrEntityPrefix {
		return "", "", "", false
	}
	k = k[1:]
	i, j := bytes.IndexByte(k, 0), bytes.LastIndexByte(k, 0)
	if i < 0 || j == i {
		return "", "", "", false
	}
	return string(k[:i]), string(k[i+1 : j]), buckets.DeviceID(k[j+1:]), true
}
