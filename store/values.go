package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/telemetryd/telemetryd/buckets"
)

// The values of a device index record (index.go), version 1:
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

// errCorruptValues is returned by decodeValues for bytes it did not write.
var errCorruptValues = errors.New("corrupt value encoding")

// appendValues appends the encoding of fields to dst.
func appendValues(dst []byte, fields []buckets.Field) []byte {
	dst = append(dst, valuesVersion)
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
			panic(fmt.Sprintf("store: encoding unknown value kind %d", v.Kind))
		}
	}
	return dst
}

// decodeValues decodes what appendValues wrote. It never panics on
// arbitrary input.
func decodeValues(b []byte) ([]buckets.Field, error) {
	if len(b) == 0 || b[0] != valuesVersion {
		return nil, fmt.Errorf("%w: unknown version", errCorruptValues)
	}
	d := valueDecoder{b: b[1:]}
	n := d.uvarint()
	if d.err != nil || n > buckets.MaxValues*4 || n > uint64(len(d.b)) {
		return nil, fmt.Errorf("%w: bad field count", errCorruptValues)
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
		return nil, fmt.Errorf("%w: truncated or trailing bytes", errCorruptValues)
	}
	return fields, nil
}

// decoder reads a byte slice, remembering the first failure so callers
// check once at the end.
type valueDecoder struct {
	b   []byte
	err error
}

func (d *valueDecoder) fail() {
	if d.err == nil {
		d.err = errCorruptValues
	}
	d.b = nil
}

func (d *valueDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *valueDecoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *valueDecoder) byte() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *valueDecoder) bytes(n uint64) []byte {
	if n > uint64(len(d.b)) {
		d.fail()
		return make([]byte, 8)
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}
