package block

import (
	"encoding/binary"
	"math/bits"

	"github.com/telemetryd/telemetryd/buckets"
)

// skipColumn moves r past the column of in without decoding its values:
// it reads only what gives the column's length (the presence bitmap,
// the kind bytes, the float encoding, string lengths) and counts the
// varints of its values by their last bytes. When cover, the readings
// it is present in are marked in sc.cover. It is for blocks whose
// checksum matched: their columns are as the encoder wrote them, so a
// column no one asked for needs no checking, only its end. Reading
// never goes past r's bytes; a column that would is an error.
func (sc *Scanner) skipColumn(r *reader, in *scanName, n int, cover bool) error {
	var counts [buckets.KindString + 1]int
	if in.count < n {
		present := r.bytes(uint64((n+7)/8), "bitmap")
		if r.err != nil {
			return r.err
		}
		if cover {
			for i := range sc.cover {
				sc.cover[i] |= present[i]
			}
		}
	} else if cover {
		for i := range sc.cover {
			sc.cover[i] = 0xff
		}
	}
	if bits.OnesCount8(in.kinds) == 1 {
		counts[bits.TrailingZeros8(in.kinds)] = in.count
	} else {
		for _, k := range r.bytes(uint64(in.count), "kind") {
			if buckets.Kind(k) > buckets.KindString {
				r.fail("kind")
				return r.err
			}
			counts[k]++
		}
	}
	if nf := counts[buckets.KindFloat]; nf > 0 {
		switch r.byte("float encoding") {
		case floatDecimal:
			r.byte("exponent")
			r.skipVarints(nf, "decimal")
		case floatXOR:
			r.bytes(8*uint64(nf), "xor")
		default:
			r.fail("float encoding")
		}
	}
	r.skipVarints(counts[buckets.KindInt], "int")
	if nb := counts[buckets.KindBool]; nb > 0 {
		r.bytes(uint64((nb+7)/8), "bitmap")
	}
	if ns := counts[buckets.KindString]; ns > 0 {
		size := r.uvarint("dictionary size")
		for range min(size, uint64(ns)) {
			r.bytes(r.uvarint("string length"), "string")
		}
		if size > 1 {
			r.skipVarints(ns, "string index")
		}
	}
	return r.err
}

// continuation has the top bit of each byte of a word: a varint's bytes
// but its last have it set.
const continuation = 0x8080808080808080

// skipVarints moves r past k varints (signed and unsigned ones end the
// same way: at the first byte below 0x80), 32 or eight bytes at a time
// while those bytes cannot hold the end of the k-th.
func (r *reader) skipVarints(k int, what string) {
	b, i := r.b, 0
	for k > 32 && len(b)-i >= 32 {
		p := b[i : i+32]
		ends := bits.OnesCount64(^binary.LittleEndian.Uint64(p)&continuation) +
			bits.OnesCount64(^binary.LittleEndian.Uint64(p[8:])&continuation) +
			bits.OnesCount64(^binary.LittleEndian.Uint64(p[16:])&continuation) +
			bits.OnesCount64(^binary.LittleEndian.Uint64(p[24:])&continuation)
		if ends >= k {
			break
		}
		k -= ends
		i += 32
	}
	for k > 0 {
		if len(b)-i >= 8 {
			ends := bits.OnesCount64(^binary.LittleEndian.Uint64(b[i:]) & continuation)
			if ends < k {
				k -= ends
				i += 8
				continue
			}
		}
		if i >= len(b) {
			r.fail(what)
			return
		}
		if b[i] < 0x80 {
			k--
		}
		i++
	}
	r.b = b[i:]
}
