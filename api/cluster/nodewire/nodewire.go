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
	"github.com/telemetryd/telemetryd/buckets/binread"
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
	d := binread.NewReader(b[1:])
	n := d.Uvarint()
	if d.Failed() || n > buckets.MaxValues*4 || n > uint64(d.Len()) {
		return nil, fmt.Errorf("%w: bad field count", ErrCorrupt)
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
		return nil, fmt.Errorf("%w: truncated or trailing bytes", ErrCorrupt)
	}
	return fields, nil
}
