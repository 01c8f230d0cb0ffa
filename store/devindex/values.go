package devindex

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/binread"
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

// AppendValues appends the encoding of fields to dst, as a device
// record holds its newest values.
func AppendValues(dst []byte, fields []buckets.Field) []byte {
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
			panic(fmt.Sprintf("devindex: encoding unknown value kind %d", v.Kind))
		}
	}
	return dst
}

// decodeValues decodes what AppendValues wrote. It never panics on
// arbitrary input.
func decodeValues(b []byte) ([]buckets.Field, error) {
	if len(b) == 0 || b[0] != valuesVersion {
		return nil, fmt.Errorf("%w: unknown version", errCorruptValues)
	}
	d := binread.NewReader(b[1:])
	n := d.Uvarint()
	if d.Failed() || n > buckets.MaxValues*4 || n > uint64(d.Len()) {
		return nil, fmt.Errorf("%w: bad field count", errCorruptValues)
	}
	fields := make([]buckets.Field, 0, n)
	for i := uint64(0); i < n && !d.Failed(); i++ {
		name := string(d.Bytes(d.Uvarint()))
		var v buckets.Value
		switch tag := d.Byte(); tag {
		case tagFloat:
			v = buckets.Float(d.Float64())
		case tagFloatInt:
			v = buckets.Float(float64(d.Varint()))
		case tagInt:
			v = buckets.Int(d.Varint())
		case tagFalse, tagTrue:
			v = buckets.Bool(tag == tagTrue)
		case tagString:
			v = buckets.String(string(d.Bytes(d.Uvarint())))
		default:
			d.Fail()
		}
		fields = append(fields, buckets.Field{Name: name, Value: v})
	}
	if d.Failed() || d.Len() != 0 {
		return nil, fmt.Errorf("%w: truncated or trailing bytes", errCorruptValues)
	}
	return fields, nil
}
