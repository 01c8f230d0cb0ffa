package wire

import (
	"encoding/binary"
	"math"

	"github.com/telemetryd/telemetryd/buckets"
)

// Decode returns the readings of a payload published by device, each
// valid as buckets.Reading.Validate requires, and its attribute
// assignments for device (nil in version 1). Every error is a
// *buckets.ValidationError: invalid_payload for a malformed payload
// (Index -1, or the reading at fault), otherwise the code Validate or
// the attribute checks give. The strings share one copy of data.
func Decode(device buckets.DeviceID, data []byte) ([]buckets.Reading, []buckets.Assignment, error) {
	if err := device.Validate(); err != nil {
		return nil, nil, err
	}
	d := decoder{data: data, device: device, index: -1}
	rs, err := d.decode()
	if err != nil {
		return nil, nil, err
	}
	var as []buckets.Assignment
	if data[0] == versionAssigns {
		if as, err = d.assignments(); err != nil {
			return nil, nil, err
		}
	}
	if d.pos != len(d.data) {
		d.index = -1
		return nil, nil, d.fail("%d bytes after the last %s", len(d.data)-d.pos, lastPart(data[0]))
	}
	return rs, as, nil
}

func lastPart(version byte) string {
	if version == versionAssigns {
		return "assignment"
	}
	return "reading"
}

type decoder struct {
	data   []byte
	str    string // data as a string, made on first use
	pos    int
	device buckets.DeviceID
	index  int // reading being decoded, -1 before
}

func (d *decoder) fail(format string, args ...any) *buckets.ValidationError {
	args = append([]any{d.pos}, args...)
	return buckets.Invalid(buckets.CodeInvalidPayload, d.index, "", "binary payload at byte %d: "+format, args...)
}

func (d *decoder) uvarint(what string, limit uint64) (int, *buckets.ValidationError) {
	v, n := binary.Uvarint(d.data[d.pos:])
	if n <= 0 {
		return 0, d.fail("%s: truncated or overlong varint", what)
	}
	if v > limit {
		return 0, d.fail("%s %d is more than %d", what, v, limit)
	}
	d.pos += n
	return int(v), nil
}

// string returns the next n bytes as a string sharing d.str.
func (d *decoder) string(what string, n int) (string, *buckets.ValidationError) {
	if n > len(d.data)-d.pos {
		return "", d.fail("%s of %d bytes: payload ends", what, n)
	}
	if d.str == "" {
		d.str = string(d.data)
	}
	s := d.str[d.pos : d.pos+n]
	d.pos += n
	return s, nil
}

func (d *decoder) decode() ([]buckets.Reading, *buckets.ValidationError) {
	if len(d.data) == 0 || d.data[0] != version && d.data[0] != versionAssigns {
		return nil, d.fail("not version %d or %d", version, versionAssigns)
	}
	d.pos = 1
	names, ve := d.names()
	if ve != nil {
		return nil, ve
	}
	n, ve := d.uvarint("reading count", math.MaxInt32)
	switch {
	case ve != nil:
		return nil, ve
	case n == 0:
		return nil, buckets.Invalid(buckets.CodeEmptyBatch, -1, "", "a message needs at least one reading")
	case n > buckets.MaxBatch:
		return nil, buckets.Invalid(buckets.CodeBatchTooLarge, -1, "", "%d readings is more than %d", n, buckets.MaxBatch)
	}
	// Each reading takes at least 5 bytes (ticks, count, index, kind, bool).
	if n > (len(d.data)-d.pos)/5+1 {
		return nil, d.fail("%d readings cannot fit in %d bytes", n, len(d.data)-d.pos)
	}
	rs := make([]buckets.Reading, n)
	var fields []buckets.Field
	var ticks int64
	for i := range rs {
		d.index = i
		delta, k := binary.Varint(d.data[d.pos:])
		if k <= 0 {
			return nil, d.fail("ticks: truncated or overlong varint")
		}
		d.pos += k
		ticks += delta
		r := &rs[i]
		r.Device, r.Ticks = d.device, buckets.Ticks(ticks)
		if !r.Ticks.Valid() {
			return nil, buckets.Invalid(buckets.CodeInvalidTime, i, "ts", "tick count %d is outside 0001..9999", ticks)
		}
		nv, ve := d.uvarint("value count", math.MaxInt32)
		switch {
		case ve != nil:
			return nil, ve
		case nv == 0:
			return nil, buckets.Invalid(buckets.CodeNoValues, i, "values", "a reading needs at least one value")
		case nv > buckets.MaxValues:
			return nil, buckets.Invalid(buckets.CodeTooManyValues, i, "values", "%d values is more than %d", nv, buckets.MaxValues)
		}
		if cap(fields)-len(fields) < nv {
			// Room for the rest of the readings at this size, but never
			// more than the bytes left can hold (a value takes 3 or more).
			fields = make([]buckets.Field, 0, min(nv*(n-i), nv+(len(d.data)-d.pos)/3))
		}
		start, prev := len(fields), -1
		for range nv {
			f, idx, ve := d.value(names, prev)
			if ve != nil {
				return nil, ve
			}
			prev = idx
			fields = append(fields, f)
		}
		r.Values = fields[start:len(fields):len(fields)]
	}
	d.index = -1
	return rs, nil
}

// names reads the name table.
func (d *decoder) names() ([]string, *buckets.ValidationError) {
	n, ve := d.uvarint("name count", uint64(len(d.data)))
	if ve != nil {
		return nil, ve
	}
	names := make([]string, n)
	for i := range names {
		l, ve := d.uvarint("name length", buckets.MaxValueNameLen)
		if ve != nil {
			return nil, ve
		}
		if names[i], ve = d.string("name", l); ve != nil {
			return nil, ve
		}
		if err := buckets.ValidateValueName(names[i]); err != nil {
			ve := err.(*buckets.ValidationError)
			return nil, ve
		}
		if i > 0 && names[i-1] >= names[i] {
			return nil, d.fail("name %q does not follow %q in order", names[i], names[i-1])
		}
	}
	return names, nil
}

// value reads one value, whose name index must follow prev.
func (d *decoder) value(names []string, prev int) (buckets.Field, int, *buckets.ValidationError) {
	idx, ve := d.uvarint("name index", uint64(len(names)))
	if ve != nil {
		return buckets.Field{}, 0, ve
	}
	if idx >= len(names) || idx <= prev {
		return buckets.Field{}, 0, d.fail("name index %d: want %d to %d", idx, prev+1, len(names)-1)
	}
	name := names[idx]
	if d.pos >= len(d.data) {
		return buckets.Field{}, 0, d.fail("value %s: payload ends", name)
	}
	kind := buckets.Kind(d.data[d.pos])
	d.pos++
	var v buckets.Value
	switch kind {
	case buckets.KindFloat:
		if len(d.data)-d.pos < 8 {
			return buckets.Field{}, 0, d.fail("value %s: payload ends", name)
		}
		v = buckets.Float(math.Float64frombits(binary.LittleEndian.Uint64(d.data[d.pos:])))
		d.pos += 8
	case buckets.KindInt:
		i, n := binary.Varint(d.data[d.pos:])
		if n <= 0 {
			return buckets.Field{}, 0, d.fail("value %s: truncated or overlong varint", name)
		}
		d.pos += n
		v = buckets.Int(i)
	case buckets.KindBool:
		if d.pos >= len(d.data) || d.data[d.pos] > 1 {
			return buckets.Field{}, 0, d.fail("value %s: want a byte 0 or 1", name)
		}
		v = buckets.Bool(d.data[d.pos] == 1)
		d.pos++
	case buckets.KindString:
		l, ve := d.uvarint("string length", uint64(len(d.data)))
		if ve != nil {
			return buckets.Field{}, 0, ve
		}
		s, ve := d.string("string", l)
		if ve != nil {
			return buckets.Field{}, 0, ve
		}
		v = buckets.String(s)
	default:
		return buckets.Field{}, 0, d.fail("value %s: unknown kind %d", name, kind)
	}
	if err := v.Validate(); err != nil {
		ve := err.(*buckets.ValidationError)
		ve.Index, ve.Field = d.index, "values."+name
		return buckets.Field{}, 0, ve
	}
	return buckets.Field{Name: name, Value: v}, idx, nil
}

// Count is the reading count a payload declares, at least 1 (for a
// payload too damaged to say).
func Count(data []byte) int {
	d := decoder{data: data, index: -1}
	if len(data) == 0 || data[0] != version && data[0] != versionAssigns {
		return 1
	}
	d.pos = 1
	if _, ve := d.names(); ve != nil {
		return 1
	}
	n, ve := d.uvarint("reading count", buckets.MaxBatch)
	if ve != nil {
		return 1
	}
	return max(n, 1)
}

// assignments reads the assignments of a version 2 payload.
func (d *decoder) assignments() ([]buckets.Assignment, *buckets.ValidationError) {
	n, ve := d.uvarint("assignment count", buckets.MaxBatch)
	if ve != nil || n == 0 {
		return nil, ve
	}
	// Each assignment takes at least 5 bytes (at, count, two lengths, a name byte).
	if n > (len(d.data)-d.pos)/5+1 {
		return nil, d.fail("%d assignments cannot fit in %d bytes", n, len(d.data)-d.pos)
	}
	as := make([]buckets.Assignment, n)
	var names map[string]struct{} // every name, once the assignments hold more than the limit
	total := 0
	for i := range as {
		at, k := binary.Varint(d.data[d.pos:])
		if k <= 0 {
			return nil, d.fail("assignment time: truncated or overlong varint")
		}
		d.pos += k
		a := &as[i]
		a.Device, a.At = d.device, buckets.Ticks(at)
		if !a.At.Valid() {
			return nil, buckets.Invalid(buckets.CodeInvalidTime, -1, "attributes", "assignment tick count %d is outside 0001..9999", at)
		}
		set, ve := d.attributeSet()
		if ve != nil {
			return nil, ve
		}
		a.Set = set
		if total += len(set); total > buckets.MaxAttributes && names == nil {
			names = make(map[string]struct{}, 2*buckets.MaxAttributes)
			for _, b := range as[:i] {
				for _, x := range b.Set {
					names[x.Name] = struct{}{}
				}
			}
		}
		if names != nil {
			for _, x := range set {
				names[x.Name] = struct{}{}
			}
			if len(names) > buckets.MaxAttributes {
				return nil, buckets.Invalid(buckets.CodeTooManyAttributes, -1, "attributes",
					"the assignments name %d attributes, at most %d are allowed", len(names), buckets.MaxAttributes)
			}
		}
	}
	return as, nil
}

// attributeSet reads the attributes of one assignment.
func (d *decoder) attributeSet() (buckets.Attributes, *buckets.ValidationError) {
	n, ve := d.uvarint("attribute count", buckets.MaxAttributes)
	switch {
	case ve != nil:
		return nil, ve
	case n == 0:
		return nil, d.fail("an assignment needs at least one attribute")
	}
	set := make(buckets.Attributes, n)
	for i := range set {
		l, ve := d.uvarint("attribute name length", buckets.MaxAttributeNameBytes)
		if ve != nil {
			return nil, ve
		}
		name, ve := d.string("attribute name", l)
		if ve != nil {
			return nil, ve
		}
		if ve := buckets.ValidateAttributeName(name); ve != nil {
			return nil, ve
		}
		if i > 0 && set[i-1].Name >= name {
			return nil, d.fail("attribute %q does not follow %q in order", name, set[i-1].Name)
		}
		if l, ve = d.uvarint("attribute value length", buckets.MaxAttributeValueBytes); ve != nil {
			return nil, ve
		}
		value, ve := d.string("attribute value", l)
		if ve != nil {
			return nil, ve
		}
		if ve := buckets.ValidateAttributeValue(name, value); ve != nil {
			return nil, ve
		}
		set[i] = buckets.Attribute{Name: name, Value: value}
	}
	return set, nil
}
