// Package wire is the compact binary form of one device's readings in
// a JetStream message, an alternative to the JSON payload (ingest/README.md)
// for producers inside the service: the line protocol door publishes
// it, the ingester decodes it. A message in this form carries the
// header Telemetry-Format: binary/1; without the header a payload is
// JSON. The header names the binary form; the payload's first byte is
// the version of its layout: 1 for readings alone, 2 for readings and
// attribute assignments. Encoder writes version 1 when it has no
// assignment, so its payloads stay readable by a version-1 decoder
// where they can; Decode reads both, so the messages a stream kept
// from before version 2 still decode.
//
// Layout (varints as encoding/binary's; every count bounded):
//
//	version     byte, 1 or 2
//	names       uvarint n (>= 1), then n times: uvarint length, bytes;
//	            strictly ascending, each a valid value name
//	readings    uvarint n (1..buckets.MaxBatch), then n times:
//	  ticks     varint, the difference to the previous reading's ticks
//	            (to 0 for the first)
//	  values    uvarint n (1..buckets.MaxValues), then n times:
//	    name    uvarint index into names, strictly ascending in a reading
//	    kind    byte, buckets.Kind
//	    value   float: 8 bytes, IEEE 754 bits little endian; int: varint;
//	            bool: one byte 0 or 1; string: uvarint length, bytes
//	assignments version 2 only: uvarint n (0..buckets.MaxBatch), then n
//	            times:
//	  at        varint, the ticks the assignment holds as of
//	  set       uvarint n (1..buckets.MaxAttributes), then n times:
//	            uvarint length, name bytes, uvarint length, value
//	            bytes; names strictly ascending
//
// Nothing may follow the last reading (version 1) or the last
// assignment (version 2). Decode validates everything that
// buckets.Reading.Validate checks (the time window is the ingester's),
// attribute names and values as buckets.ValidateAttributeName and
// ValidateAttributeValue, and that the assignments of a payload name at
// most buckets.MaxAttributes attributes together.
package wire

import (
	"encoding/binary"
	"math"
	"slices"

	"github.com/telemetryd/telemetryd/buckets"
)

// Header names the payload format of a message; Format is its value for
// this package's form.
const (
	Header = "Telemetry-Format"
	Format = "binary/1"
)

// The first byte of a payload: its layout.
const (
	version        = 1 // readings
	versionAssigns = 2 // readings, then attribute assignments
)

// Encoder builds one payload. Its zero value is ready; Reset starts the
// next payload and keeps the buffers.
type Encoder struct {
	readings []reading
	names    map[string]int // name -> index in the sorted table
	sorted   []string
	size     int
	prev     []buckets.Field // values of the last reading added
	index    []int           // scratch of Append: name indexes of a reading
	assigns  []assignment
}

// assignment is one added assignment; its attributes are only
// referenced.
type assignment struct {
	at  buckets.Ticks
	set buckets.Attributes
}

// reading is one added reading; its values are only referenced.
type reading struct {
	ticks  buckets.Ticks
	values []buckets.Field
}

// Upper bounds of encoded parts, for Size.
const (
	maxReadingHead = binary.MaxVarintLen64 + binary.MaxVarintLen16 // ticks, count
	maxValueHead   = binary.MaxVarintLen16 + 1                     // name index, kind
)

// Reset forgets the payload being built.
func (e *Encoder) Reset() {
	clear(e.readings)
	e.readings = e.readings[:0]
	clear(e.names)
	clear(e.assigns)
	e.assigns = e.assigns[:0]
	e.size, e.prev = 0, nil
}

// Len is the number of readings added since Reset.
func (e *Encoder) Len() int { return len(e.readings) }

// Size bounds the size of the payload Append would write now.
func (e *Encoder) Size() int { return 1 + 2*binary.MaxVarintLen64 + e.size }

// Add adds a valid reading (values sorted by name, unique). values is
// referenced until Append, not copied.
func (e *Encoder) Add(ticks buckets.Ticks, values []buckets.Field) {
	if e.names == nil {
		e.names = make(map[string]int)
	}
	e.readings = append(e.readings, reading{ticks, values})
	e.size += maxReadingHead
	// Readings of one device mostly carry the same names: look them up
	// only when they differ from the last reading's.
	known := sameNames(values, e.prev)
	for _, f := range values {
		if !known {
			if _, ok := e.names[f.Name]; !ok {
				e.names[f.Name] = 0
				e.size += binary.MaxVarintLen16 + len(f.Name)
			}
		}
		e.size += maxValueHead + valueSize(f.Value)
	}
	e.prev = values
}

// Assign adds an assignment of a valid, non-empty attribute set (sorted
// by name, names unique) as of at. set is referenced until Append, not
// copied. A payload with assignments is written in version 2.
func (e *Encoder) Assign(at buckets.Ticks, set buckets.Attributes) {
	if len(e.assigns) == 0 {
		e.size += binary.MaxVarintLen64 // the count
	}
	e.assigns = append(e.assigns, assignment{at, set})
	e.size += AssignSize(set)
}

// AssignSize bounds what assigning set would add to Size.
func AssignSize(set buckets.Attributes) int {
	n := binary.MaxVarintLen64 + binary.MaxVarintLen16
	for _, a := range set {
		n += 2*binary.MaxVarintLen16 + len(a.Name) + len(a.Value)
	}
	return n
}

func sameNames(a, b []buckets.Field) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name {
			return false
		}
	}
	return true
}

// AddSize bounds what adding a reading with values would add to Size
// (counting every name as new).
func AddSize(values []buckets.Field) int {
	n := maxReadingHead
	for _, f := range values {
		n += binary.MaxVarintLen16 + len(f.Name) + maxValueHead + valueSize(f.Value)
	}
	return n
}

func valueSize(v buckets.Value) int {
	switch v.Kind {
	case buckets.KindFloat:
		return 8
	case buckets.KindInt:
		return binary.MaxVarintLen64
	case buckets.KindBool:
		return 1
	default:
		return binary.MaxVarintLen16 + len(v.AsString())
	}
}

// Append appends the payload of the readings added since Reset to dst.
func (e *Encoder) Append(dst []byte) []byte {
	e.sorted = e.sorted[:0]
	for n := range e.names {
		e.sorted = append(e.sorted, n)
	}
	slices.Sort(e.sorted)
	for i, n := range e.sorted {
		e.names[n] = i
	}
	if len(e.assigns) > 0 {
		dst = append(dst, versionAssigns)
	} else {
		dst = append(dst, version)
	}
	dst = binary.AppendUvarint(dst, uint64(len(e.sorted)))
	for _, n := range e.sorted {
		dst = binary.AppendUvarint(dst, uint64(len(n)))
		dst = append(dst, n...)
	}
	dst = binary.AppendUvarint(dst, uint64(len(e.readings)))
	var last buckets.Ticks
	var prev []buckets.Field // the names of e.index
	for _, r := range e.readings {
		dst = binary.AppendVarint(dst, int64(r.ticks-last))
		last = r.ticks
		dst = binary.AppendUvarint(dst, uint64(len(r.values)))
		// Look the names up only when they differ from the previous
		// reading's.
		if prev == nil || !sameNames(r.values, prev) {
			e.index = e.index[:0]
			for _, f := range r.values {
				e.index = append(e.index, e.names[f.Name])
			}
			prev = r.values
		}
		for i, f := range r.values {
			dst = binary.AppendUvarint(dst, uint64(e.index[i]))
			dst = appendValue(dst, f.Value)
		}
	}
	if len(e.assigns) == 0 {
		return dst
	}
	dst = binary.AppendUvarint(dst, uint64(len(e.assigns)))
	for _, a := range e.assigns {
		dst = binary.AppendVarint(dst, int64(a.at))
		dst = binary.AppendUvarint(dst, uint64(len(a.set)))
		for _, x := range a.set {
			dst = binary.AppendUvarint(dst, uint64(len(x.Name)))
			dst = append(dst, x.Name...)
			dst = binary.AppendUvarint(dst, uint64(len(x.Value)))
			dst = append(dst, x.Value...)
		}
	}
	return dst
}

func appendValue(b []byte, v buckets.Value) []byte {
	b = append(b, byte(v.Kind))
	switch v.Kind {
	case buckets.KindFloat:
		return binary.LittleEndian.AppendUint64(b, math.Float64bits(v.AsFloat()))
	case buckets.KindInt:
		return binary.AppendVarint(b, v.AsInt())
	case buckets.KindBool:
		if v.AsBool() {
			return append(b, 1)
		}
		return append(b, 0)
	default:
		s := v.AsString()
		b = binary.AppendUvarint(b, uint64(len(s)))
		return append(b, s...)
	}
}
