package buckets

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Value encoding, version 1:
//
//	version byte (1)
//	uvarint   number of fields
//	per field: uvarint name length, name, tag byte, payload
//
// Tags: 1 float64 (8 bytes little-endian), 2 int64 (zigzag varint),
// 3 false, 4 true, 5 string (uvarint length + bytes), 6 float64 that
// holds an integer of at most 2^53 in magnitude (zigzag varint; most
// sensor values are whole numbers and shrink from 8 bytes to 1-3).
const valuesVersion = 1

const (
	tagFloat = iota + 1
	tagInt
	tagFalse
	tagTrue
	tagString
	tagFloatInt
)

// errCorrupt is returned by DecodeValues for bytes it did not write.
var errCorrupt = errors.New("corrupt value encoding")

// AppendValues appends the encoding of fields to dst.
func AppendValues(dst []byte, fields []Field) []byte {
	dst = append(dst, valuesVersion)
	dst = binary.AppendUvarint(dst, uint64(len(fields)))
	for _, f := range fields {
		dst = binary.AppendUvarint(dst, uint64(len(f.Name)))
		dst = append(dst, f.Name...)
		v := f.Value
		switch v.Kind {
		case KindFloat:
			fl := v.AsFloat()
			if i := int64(fl); float64(i) == fl && i >= -1<<53 && i <= 1<<53 && !(fl == 0 && math.Signbit(fl)) {
				dst = append(dst, tagFloatInt)
				dst = binary.AppendVarint(dst, i)
			} else {
				dst = append(dst, tagFloat)
				dst = binary.LittleEndian.AppendUint64(dst, v.num)
			}
		case KindInt:
			dst = append(dst, tagInt)
			dst = binary.AppendVarint(dst, v.AsInt())
		case KindBool:
			if v.AsBool() {
				dst = append(dst, tagTrue)
			} else {
				dst = append(dst, tagFalse)
			}
		case KindString:
			dst = append(dst, tagString)
			dst = binary.AppendUvarint(dst, uint64(len(v.str)))
			dst = append(dst, v.str...)
		default:
			panic(fmt.Sprintf("buckets: encoding unknown value kind %d", v.Kind))
		}
	}
	return dst
}

// DecodeValues decodes what AppendValues wrote. It never panics on
// arbitrary input.
func DecodeValues(b []byte) ([]Field, error) {
	if len(b) == 0 || b[0] != valuesVersion {
		return nil, fmt.Errorf("%w: unknown version", errCorrupt)
	}
	d := decoder{b: b[1:]}
	n := d.uvarint()
	if d.err != nil || n > MaxValues*4 || n > uint64(len(d.b)) {
		return nil, fmt.Errorf("%w: bad field count", errCorrupt)
	}
	fields := make([]Field, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		name := string(d.bytes(d.uvarint()))
		var v Value
		switch tag := d.byte(); tag {
		case tagFloat:
			v = Value{Kind: KindFloat, num: binary.LittleEndian.Uint64(d.bytes(8))}
		case tagFloatInt:
			v = Float(float64(d.varint()))
		case tagInt:
			v = Int(d.varint())
		case tagFalse, tagTrue:
			v = Bool(tag == tagTrue)
		case tagString:
			v = String(string(d.bytes(d.uvarint())))
		default:
			d.fail()
		}
		fields = append(fields, Field{Name: name, Value: v})
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, fmt.Errorf("%w: truncated or trailing bytes", errCorrupt)
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
		d.err = errCorrupt
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
