package api

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// Responses that carry readings (ReadingList, Reading) are the hot
// paths of the API and are written by appending JSON into a pooled byte
// slice: no reflection, no intermediate maps, and value names come out
// in the stored (sorted) order. The bytes are exactly what
// encoding/json writes for the response types (encode_test.go); every
// other response goes through sendValue.

// maxPooledBuf is the largest buffer returned to the pool; bigger ones
// (a 10,000-reading page of wide readings) are left to the GC.
const maxPooledBuf = 4 << 20

var bufPool = sync.Pool{New: func() any {
	b := make([]byte, 0, 16<<10)
	return &b
}}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > maxPooledBuf {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

// sendAppended runs fill on a pooled buffer and writes the result with
// 200.
func sendAppended(c echo.Context, fill func(b []byte) []byte) error {
	buf := getBuf()
	defer putBuf(buf)
	*buf = fill(*buf)
	writeJSON(c, http.StatusOK, *buf)
	return nil
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Control characters, quotes
// and backslashes are escaped, invalid UTF-8 becomes U+FFFD, and
// U+2028/U+2029 are escaped so the output is also valid JavaScript.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendFloat appends f as a JSON number: plain decimal for ordinary
// magnitudes, exponent form below 1e-6 and from 1e21 on, shortest
// representation that round-trips. NaN and ±Inf cannot be stored; if
// one ever shows up it is written as null to keep the JSON valid.
func appendFloat(dst []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(dst, "null"...)
	}
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if format == 'e' {
		// 1e-07 -> 1e-7: drop the padding zero of a one-digit exponent.
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst
}

// appendValue appends one value as a JSON number, bool or string.
func appendValue(dst []byte, v buckets.Value) []byte {
	switch v.Kind {
	case buckets.KindFloat:
		return appendFloat(dst, v.AsFloat())
	case buckets.KindInt:
		return strconv.AppendInt(dst, v.AsInt(), 10)
	case buckets.KindBool:
		return strconv.AppendBool(dst, v.AsBool())
	case buckets.KindString:
		return appendString(dst, v.AsString())
	}
	return append(dst, "null"...)
}

// appendValues appends fields as a JSON object, keeping only the names
// in proj when proj is not nil. Both are sorted by name, so the
// projection is one merge walk and the keys come out sorted.
func appendValues(dst []byte, fields []buckets.Field, proj []string) []byte {
	dst = append(dst, '{')
	first := true
	j := 0
	for _, f := range fields {
		if proj != nil {
			for j < len(proj) && proj[j] < f.Name {
				j++
			}
			if j == len(proj) {
				break
			}
			if proj[j] != f.Name {
				continue
			}
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendString(dst, f.Name)
		dst = append(dst, ':')
		dst = appendValue(dst, f.Value)
	}
	return append(dst, '}')
}

// appendTicksTime appends k as a quoted RFC 3339 time with nanoseconds
// in UTC (the same text as Ticks.FormatTime).
func appendTicksTime(dst []byte, k buckets.Ticks) []byte {
	dst = append(dst, '"')
	dst = k.Time().AppendFormat(dst, time.RFC3339Nano)
	return append(dst, '"')
}

// appendReading appends the API form of a reading:
// {"ts":...,"partitionKey":...,"rowKey":...,"values":{...}}.
func appendReading(dst []byte, r *buckets.Reading, proj []string) []byte {
	dst = append(dst, `{"ts":`...)
	dst = appendTicksTime(dst, r.Ticks)
	dst = append(dst, `,"partitionKey":`...)
	dst = appendPartitionKey(dst, r)
	dst = append(dst, `,"rowKey":"`...)
	dst = appendRowKey(dst, r.Ticks)
	dst = append(dst, `","values":`...)
	dst = appendValues(dst, sortedFields(r.Values), proj)
	return append(dst, '}')
}

// appendPartitionKey appends the quoted "<device>/<YYYY-MM-DD>"
// (Reading.PartitionKey) without allocating.
func appendPartitionKey(dst []byte, r *buckets.Reading) []byte {
	dst = appendString(dst, string(r.Device))
	dst[len(dst)-1] = '/' // replaces the closing quote
	dst = r.Day().Start().Time().AppendFormat(dst, buckets.DayLayout)
	return append(dst, '"')
}

// appendRowKey appends the 19-digit inverted ticks (Ticks.RowKey)
// without allocating.
func appendRowKey(dst []byte, k buckets.Ticks) []byte {
	var digits [buckets.RowKeyLen]byte
	v := k.Inverted()
	for i := buckets.RowKeyLen - 1; i >= 0; i-- {
		digits[i] = byte('0' + v%10)
		v /= 10
	}
	return append(dst, digits[:]...)
}

// sortedFields returns fields sorted by name. Readings from the store
// are sorted already; anything else is sorted on a copy so the output
// key order stays stable.
func sortedFields(fields []buckets.Field) []buckets.Field {
	for i := 1; i < len(fields); i++ {
		if fields[i-1].Name > fields[i].Name {
			cp := append([]buckets.Field(nil), fields...)
			buckets.SortValues(cp)
			return cp
		}
	}
	return fields
}

// appendNext appends `,"next":"..."` when next is set.
func appendNext(dst []byte, next string) []byte {
	if next == "" {
		return dst
	}
	dst = append(dst, `,"next":`...)
	return appendString(dst, next)
}
