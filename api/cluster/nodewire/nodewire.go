// Package nodewire is the encoding of reading values between the nodes
// of a cluster: the "v" of every reading and of a device's latest
// values in the node-to-node API (/internal/v1/..., package
// api/cluster), base64 in its JSON. It belongs to that API alone, so
// the store may change how it keeps values on disk without a rolling
// upgrade breaking the calls between old and new nodes; a change of
// this layout gets a new Version, and decoders keep reading the old.
//
// Layout, version 1 (varints as encoding/binary's):
//
//	version    byte, 1
//	fields     uvarint n, then n times:
//	  name     uvarint length, bytes
//	  tag      byte
//	  payload  by tag: 1 float64, 8 bytes IEEE 754 bits little endian;
//	           2 int64, zigzag varint; 3 false and 4 true, none;
//	           5 string, uvarint length and bytes; 6 float64 that holds
//	           an integer of at most 2^53 in magnitude (not -0), zigzag
//	           varint
//
// Nothing may follow the last field. Every kind and every float bit
// pattern (NaN payloads, -0) arrives exactly as sent.
package nodewire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/telemetryd/telemetryd/buckets"
)

// Version is the layout AppendValues writes.
const Version = 1

// Tags of a field's payload.
const (
	tagFloat = iota + 1
	tagInt
	tagFalse
	tagTrue
	tagString
	tagFloatInt
)

// ErrCorrupt is returned by DecodeValues for bytes AppendValues did
// not write.
var ErrCorrupt = errors.New("corrupt node-to-node value encoding")

// AppendValues appends the encoding of fields to dst. It panics on a
// value of an unknown kind (buckets.Value.Validate refuses those).
func AppendValues(dst []byte, fields []buckets.Field) []byte {
	dst = append(dst, Version)
	dst = binary.AppendUvarint(dst, uint64(len(fields)))
	for _, f := range fields {
		dst = binary.AppendUvarint(dst, uint64(len(f.Name)))
		dst = append(dst, f.Name...)
		v := f.Value
		switch v.Kind {
		case buckets.KindFloat:
			fl := v.AsFloat()
			if i := int64(fl); float64(i) == fl && i >= -1<<53 && i <= 1<<53 && !(fl == 0 && math.Signbit(fl)) {
				dst = append(dst, tagFloatInt)
				dst = binary.AppendVarint(dst, i)
			} else {
				dst = append(dst, tagFloat)
				dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(fl))
			}
		case buckets.KindInt:
			dst = append(dst, tagInt)
			dst = binary.AppendVarint(dst, v.AsInt())
		case buckets.KindBool:
			if v.AsBool() {
				dst = append(dst, tagTrue)
			} else {
				dst = append(dst, tagFalse)
			}
		case buckets.KindString:
			s := v.AsString()
			dst = append(dst, tagString)
			dst = binary.AppendUvarint(dst, uint64(len(s)))
			dst = append(dst, s...)
		default:
			panic(fmt.Sprintf("nodewire: encoding unknown value kind %d", v.Kind))
		}
	}
	return dst
}

// DecodeValues decodes what AppendValues wrote; the error wraps
// ErrCorrupt. It never panics on arbitrary input.
func DecodeValues(b []byte) ([]buckets.Field, error) {
	if len(b) == 0 || b[0] != Version {
		return nil, fmt.Errorf("%w: unknown version", ErrCorrupt)
	}
	d := decoder{b: b[1:]}
	n := d.uvarint()
	if d.err != nil || n > buckets.MaxValues*4 || n > uint64(len(d.b)) {
		return nil, fmt.Errorf("%w: bad field count", ErrCorrupt)
	}
	fields := make([]buckets.Field, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		name := string(d.bytes(d.uvarint()))
		var v buckets.Value
		switch tag := d.byte(); tag {
		case tagFloat:
			v = buckets.Float(math.Float64frombits(binary.LittleEndian.Uint64(d.bytes(8))))
		case tagFloatInt:
			v = buckets.Float(float64(d.varint()))
		case tagInt:
			v = buckets.Int(d.varint())
		case tagFalse, tagTrue:
			v = buckets.Bool(tag == tagTrue)
		case tagString:
			v = buckets.String(string(d.bytes(d.uvarint())))
		default:
			d.fail()
		}
		fields = append(fields, buckets.Field{Name: name, Value: v})
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, fmt.Errorf("%w: truncated or trailing bytes", ErrCorrupt)
	}
	return fields, nil
}

// decoder reads a byte slice, remembering the first failure so callers
// check once at the end.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = ErrCorrupt
	}
	d.b = nil
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bytes(n uint64) []byte {
	if n > uint64(len(d.b)) {
		d.fail()
		return make([]byte, 8)
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}
