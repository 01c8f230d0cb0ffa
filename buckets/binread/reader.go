// Package binread holds what the project's binary encodings of
// values share: a Reader of the primitives they are built from
// (uvarints, zigzag varints, length-prefixed bytes and float64s as 8
// bytes little endian) that remembers its first failure, so a decoder
// reads a run of fields and checks once.
package binread

import (
	"encoding/binary"
	"math"
)

// Reader reads the primitives of a binary record from a byte slice.
// The first read that runs past the end or meets a malformed varint
// fails the reader, as Fail does: that read and every later one return
// zero values, so a decoder reads a whole run of fields and checks
// Failed once.
type Reader struct {
	b      []byte
	failed bool
}

// NewReader returns a Reader of b.
func NewReader(b []byte) Reader { return Reader{b: b} }

// Failed reports whether a read has failed or Fail was called.
func (r *Reader) Failed() bool { return r.failed }

// Fail fails the reader: for a decoder that meets bytes it does not
// understand, such as an unknown tag.
func (r *Reader) Fail() {
	r.failed = true
	r.b = nil
}

// Len is the number of bytes not read yet (0 once failed).
func (r *Reader) Len() int { return len(r.b) }

// Uvarint reads an unsigned varint.
func (r *Reader) Uvarint() uint64 {
	if len(r.b) > 0 && r.b[0] < 0x80 { // one byte: most counts, lengths and offsets
		v := r.b[0]
		r.b = r.b[1:]
		return uint64(v)
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.Fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Varint reads a zigzag varint.
func (r *Reader) Varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.Fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Byte reads one byte.
func (r *Reader) Byte() byte {
	if len(r.b) < 1 {
		r.Fail()
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// Bytes reads n bytes; the slice shares the reader's memory. It is nil
// when fewer are left.
func (r *Reader) Bytes(n uint64) []byte {
	if uint64(len(r.b)) < n {
		r.Fail()
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

// Float64 reads the IEEE 754 bits of a float64, 8 bytes little endian.
func (r *Reader) Float64() float64 {
	if len(r.b) < 8 {
		r.Fail()
		return 0
	}
	f := math.Float64frombits(binary.LittleEndian.Uint64(r.b))
	r.b = r.b[8:]
	return f
}
