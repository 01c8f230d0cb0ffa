package rollup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/binread"
)

// Bucket is one rollup bucket of a device: its start, per numeric
// value name the summary of its readings (sorted by name), and whether
// no two readings of the bucket share a millisecond (then a summary of
// the newest value per millisecond, as a Prometheus series sees it, is
// the same summary).
type Bucket struct {
	Start      buckets.Ticks
	DistinctMs bool
	Values     []buckets.NamedSummary
}

// ErrCorrupt is wrapped by every error about a record that does not
// decode.
var ErrCorrupt = errors.New("corrupt rollup record")

// recordVersion is the first byte of every record.
const recordVersion = 1

// Flags of a bucket.
const flagDistinctMs = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// A record holds the buckets of one device and one span of a level
// (Level.span), oldest first:
//
//	version byte (1)
//	uvarint bucket count, then per bucket:
//	    uvarint (start - span start) / interval
//	    flags byte (1: distinct milliseconds)
//	    uvarint name count, then per name (sorted):
//	        uvarint length, name
//	        uvarint count (at least 1)
//	        sum, min, max, first, last: float64, 8 bytes little-endian each
//	        uvarint first ticks - start, uvarint last ticks - start
//	CRC-32C of all the bytes before it, 4 bytes big-endian

// appendRecord encodes bs (oldest first, each starting in the span at
// spanStart) after dst.
func appendRecord(dst []byte, spanStart, interval buckets.Ticks, bs []Bucket) []byte {
	start := len(dst)
	dst = append(dst, recordVersion)
	dst = binary.AppendUvarint(dst, uint64(len(bs)))
	for _, b := range bs {
		dst = binary.AppendUvarint(dst, uint64((b.Start-spanStart)/interval))
		var flags byte
		if b.DistinctMs {
			flags |= flagDistinctMs
		}
		dst = append(dst, flags)
		dst = binary.AppendUvarint(dst, uint64(len(b.Values)))
		for _, v := range b.Values {
			s := v.Summary
			dst = binary.AppendUvarint(dst, uint64(len(v.Name)))
			dst = append(dst, v.Name...)
			dst = binary.AppendUvarint(dst, uint64(s.Count))
			for _, f := range [...]float64{s.Sum, s.Min, s.Max, s.First, s.Last} {
				dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(f))
			}
			dst = binary.AppendUvarint(dst, uint64(s.FirstTicks-b.Start))
			dst = binary.AppendUvarint(dst, uint64(s.LastTicks-b.Start))
		}
	}
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// decoder decodes the records of one scan. It interns value names
// (a bucket's names are most often the previous bucket's, in the same
// order, so they are compared with those before the map is asked) and
// hands buckets their Values from slabs: the first holds one record's,
// the next ones as many as the scan still needs if the rest of [lo, hi)
// is as dense as what came before (at most maxSlab), so a long scan of
// a device that reports steadily allocates its summaries a few times in
// all rather than once a record.
type decoder struct {
	lo, hi buckets.Ticks   // the scan's range; hi 0: unknown
	want   map[string]bool // the names to keep; nil: every name
	names  map[string]string
	last   []string // the names of the bucket decoded last, in order
	slab   []buckets.NamedSummary
	used   int // summaries handed out so far
}

// maxSlab bounds the summaries of one slab (2.6 MB): what a guess from
// a device that stops reporting can leave unused.
const maxSlab = 1 << 15

// values returns room for nn summaries of the bucket at start, whose
// record still needs at least need.
func (d *decoder) values(start buckets.Ticks, nn, need uint64) []buckets.NamedSummary {
	if uint64(cap(d.slab)-len(d.slab)) < nn {
		n := need
		if d.used > 0 && d.lo < start && start < d.hi {
			rest := float64(d.used) * float64(d.hi-start) / float64(start-d.lo)
			n = max(n, uint64(min(rest, maxSlab)))
		}
		d.slab = make([]buckets.NamedSummary, 0, n)
	}
	n := len(d.slab)
	d.slab = d.slab[:n+int(nn)]
	d.used += int(nn)
	return d.slab[n : n : n+int(nn)]
}

// giveBack returns the last m summaries values handed out, which a
// bucket did not keep.
func (d *decoder) giveBack(m int) {
	d.slab = d.slab[:len(d.slab)-m]
	d.used -= m
}

// intern returns name nb, the k-th of its bucket, as a string shared
// by every bucket of the scan.
func (d *decoder) intern(k int, nb []byte) string {
	if k < len(d.last) && d.last[k] == string(nb) {
		return d.last[k]
	}
	name, ok := d.names[string(nb)]
	if !ok {
		if d.names == nil {
			d.names = make(map[string]string)
		}
		name = string(nb)
		d.names[name] = name
	}
	if k < len(d.last) {
		d.last[k] = name
	} else {
		d.last = append(d.last, name)
	}
	return name
}

// decodeRecord decodes a record of the span at spanStart, calling fn
// for each bucket, oldest first. A bucket's Values are its own (the
// buckets share slabs of d).
//
// Long: it checks every field of the record layout in the order it is written.
func decodeRecord(v []byte, spanStart, interval, span buckets.Ticks, d *decoder, fn func(Bucket) error) error {
	if len(v) < 5 || v[0] != recordVersion {
		return fmt.Errorf("%w: bad version or length", ErrCorrupt)
	}
	body := v[:len(v)-4]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(v[len(v)-4:]) {
		return fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	r := binread.NewReader(body[1:])
	n := r.Uvarint()
	if n > uint64(span/interval) {
		return fmt.Errorf("%w: %d buckets", ErrCorrupt, n)
	}
	prev := int64(-1)
	for j := range n {
		i := r.Uvarint()
		if r.Failed() || i >= uint64(span/interval) || int64(i) <= prev {
			return fmt.Errorf("%w: bad bucket offset", ErrCorrupt)
		}
		prev = int64(i)
		b := Bucket{Start: spanStart + buckets.Ticks(i)*interval}
		b.DistinctMs = r.Byte()&flagDistinctMs != 0
		nn := r.Uvarint()
		if r.Failed() || nn == 0 || nn > 1<<16 {
			return fmt.Errorf("%w: bad name count", ErrCorrupt)
		}
		b.Values = d.values(b.Start, nn, nn*(n-j)) // room for as wide buckets to come
		b.Values = b.Values[:nn]
		kept := 0
		for k := range int(nn) {
			v := &b.Values[kept] // written in place: the slab is the answer
			v.Name = d.intern(k, r.Bytes(r.Uvarint()))
			s := &v.Summary
			s.Count = int64(r.Uvarint())
			s.Sum, s.Min, s.Max, s.First, s.Last = floats5(&r)
			ft, lt := r.Uvarint(), r.Uvarint()
			if r.Failed() || s.Count <= 0 || ft >= uint64(interval) || lt >= uint64(interval) {
				return fmt.Errorf("%w: bad summary", ErrCorrupt)
			}
			s.FirstTicks, s.LastTicks = b.Start+buckets.Ticks(ft), b.Start+buckets.Ticks(lt)
			if d.want == nil || d.want[v.Name] {
				kept++
			}
		}
		d.giveBack(int(nn) - kept)
		b.Values = b.Values[:kept:kept]
		if kept == 0 { // none of the names asked for
			continue
		}
		if err := fn(b); err != nil {
			return err
		}
	}
	if r.Len() != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, r.Len())
	}
	return nil
}

// floats5 reads five float64s (sum, min, max, first, last) with one
// bounds check: they are most of a record's bytes.
func floats5(r *binread.Reader) (a, b, c, d, e float64) {
	p := r.Bytes(40)
	if len(p) < 40 {
		return
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(p[i : i+8])) }
	return f(0), f(8), f(16), f(24), f(32)
}
