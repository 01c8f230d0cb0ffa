package api

import (
	"math"
	"net/http"
	"strconv"
	"sync"
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
	if m, ok := centis(f); ok {
		return appendCentis(dst, m)
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

// maxCentis bounds the fast path of appendFloat: below it a float64
// is precise to far less than a hundredth, so two different multiples
// of 0.01 (or of 0.001, next to a power of ten) never round to the
// same float.
const maxCentis = 1e9

// centis returns m when f is exactly the float64 nearest to m/100 (a
// decimal with at most two digits after the point, the common case of
// sensor readings), f is not zero and |f| < maxCentis. The decimal m/100
// then round-trips to f and no shorter decimal does, so its text with
// trailing zeros dropped is what strconv's shortest form writes
// (TestAppendFloatCentis checks that against strconv).
func centis(f float64) (int64, bool) {
	if f == 0 || f >= maxCentis || f <= -maxCentis {
		return 0, false
	}
	m := math.Round(f * 100)
	// float64(m) is exact and the division rounds correctly: the same
	// float64 that parsing the decimal m/100 gives.
	if m == 0 || m/100 != f {
		return 0, false
	}
	return int64(m), true
}

// appendCentis appends m/100 in plain decimal without trailing zeros.
func appendCentis(dst []byte, m int64) []byte {
	if m < 0 {
		dst = append(dst, '-')
		m = -m
	}
	dst = strconv.AppendInt(dst, m/100, 10)
	switch c := m % 100; {
	case c == 0:
	case c%10 == 0:
		dst = append(dst, '.', byte('0'+c/10))
	default:
		dst = append(dst, '.', byte('0'+c/10), byte('0'+c%10))
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
	var e listEncoder
	return e.appendValues(dst, fields, proj)
}

// appendTicksTime appends k as a quoted RFC 3339 time with nanoseconds
// in UTC: the bytes of k.Time().AppendFormat(time.RFC3339Nano) (the
// same text as Ticks.FormatTime), written by hand because every
// reading of a list carries one (TestAppendTicksTime, FuzzAppendTicksTime).
func appendTicksTime(dst []byte, k buckets.Ticks) []byte {
	dst = append(dst, '"')
	dst = appendDate(dst, buckets.DayOf(k))
	return appendClock(dst, k)
}

// appendClock appends the part of appendTicksTime after the date:
// THH:MM:SS, the fraction of a second without trailing zeros, Z and
// the closing quote.
func appendClock(dst []byte, k buckets.Ticks) []byte {
	sec := int64(k%buckets.TicksPerDay) / buckets.TicksPerSecond
	dst = append(dst, 'T')
	dst = append2(dst, sec/3600)
	dst = append(dst, ':')
	dst = append2(dst, sec/60%60)
	dst = append(dst, ':')
	dst = append2(dst, sec%60)
	if frac := int64(k % buckets.TicksPerSecond); frac != 0 {
		// Seven digits of 100 ns; RFC3339Nano drops trailing zeros.
		var digits [7]byte
		for i := len(digits) - 1; i >= 0; i-- {
			digits[i] = byte('0' + frac%10)
			frac /= 10
		}
		n := len(digits)
		for digits[n-1] == '0' {
			n--
		}
		dst = append(dst, '.')
		dst = append(dst, digits[:n]...)
	}
	return append(dst, 'Z', '"')
}

// appendDate appends day d as YYYY-MM-DD (buckets.DayLayout; days of
// ticks always have four-digit years).
func appendDate(dst []byte, d buckets.Day) []byte {
	y, m, dd := civil(int64(d))
	dst = append2(dst, y/100)
	dst = append2(dst, y%100)
	dst = append(dst, '-')
	dst = append2(dst, m)
	dst = append(dst, '-')
	return append2(dst, dd)
}

// append2 appends v (0-99) as two digits.
func append2(dst []byte, v int64) []byte {
	return append(dst, byte('0'+v/10), byte('0'+v%10))
}

// civil returns the proleptic Gregorian year, month and day of the
// day that is days after 0001-01-01 (days >= 0), counting in 400-year
// eras of 146,097 days that start on March 1st so that leap days fall
// at the end of a year.
func civil(days int64) (y, m, d int64) {
	z := days + 306 // days since 0000-03-01
	era := z / 146097
	doe := z - era*146097                                  // day of era, 0..146096
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365 // year of era, 0..399
	doy := doe - (365*yoe + yoe/4 - yoe/100)               // day of the March-based year, 0..365
	mp := (5*doy + 2) / 153                                // month from March, 0..11
	d = doy - (153*mp+2)/5 + 1
	m = mp + 3
	y = era*400 + yoe
	if m > 12 {
		m -= 12
		y++
	}
	return y, m, d
}

// appendReading appends the API form of a reading:
// {"ts":...,"partitionKey":...,"rowKey":...,"values":{...}}.
func appendReading(dst []byte, r *buckets.Reading, proj []string) []byte {
	var e listEncoder
	return e.appendReading(dst, r, proj)
}

// listEncoder writes the readings of a list, rendering what readings
// share once instead of once per reading: the date and partition key
// of a device and day, and the quoted value names. The zero value is
// ready to use.
type listEncoder struct {
	dev   buckets.DeviceID
	day   buckets.Day
	key   []byte // `"<device>/<date>"` of dev and day; nil: none yet
	date  []byte // `"<date>` of day
	names []quotedName
}

// quotedName is a value name and its JSON text with the colon.
type quotedName struct {
	name string
	text []byte
}

// appendReading is appendReading with what e has rendered already.
func (e *listEncoder) appendReading(dst []byte, r *buckets.Reading, proj []string) []byte {
	if day := r.Day(); e.key == nil || day != e.day || r.Device != e.dev {
		e.dev, e.day = r.Device, day
		e.key = appendString(e.key[:0], string(r.Device))
		e.key[len(e.key)-1] = '/' // replaces the closing quote
		e.key = appendDate(e.key, day)
		e.key = append(e.key, '"')
		e.date = appendDate(append(e.date[:0], '"'), day)
	}
	dst = append(dst, `{"ts":`...)
	dst = append(dst, e.date...)
	dst = appendClock(dst, r.Ticks)
	dst = append(dst, `,"partitionKey":`...)
	dst = append(dst, e.key...)
	dst = append(dst, `,"rowKey":"`...)
	dst = appendRowKey(dst, r.Ticks)
	dst = append(dst, `","values":`...)
	dst = e.appendValues(dst, sortedFields(r.Values), proj)
	return append(dst, '}')
}

// appendValues is appendValues with the names quoted once: a list's
// readings mostly carry the same names in the same places, so e keeps
// the quoted name last seen at each place.
func (e *listEncoder) appendValues(dst []byte, fields []buckets.Field, proj []string) []byte {
	dst = append(dst, '{')
	first := true
	j := 0
	for i, f := range fields {
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
		for len(e.names) <= i {
			e.names = append(e.names, quotedName{})
		}
		qn := &e.names[i]
		if qn.text == nil || qn.name != f.Name {
			qn.name = f.Name
			qn.text = append(appendString(qn.text[:0], f.Name), ':')
		}
		dst = append(dst, qn.text...)
		dst = appendValue(dst, f.Value)
	}
	return append(dst, '}')
}

// appendRowKey appends the 19-digit inverted ticks (Ticks.RowKey)
// without allocating, two digits at a time.
func appendRowKey(dst []byte, k buckets.Ticks) []byte {
	var digits [buckets.RowKeyLen + 1]byte
	v := k.Inverted()
	for i := len(digits) - 2; i >= 0; i -= 2 {
		d := v % 100 * 2
		digits[i], digits[i+1] = pairs[d], pairs[d+1]
		v /= 100
	}
	return append(dst, digits[1:]...)
}

// pairs holds the two digits of 00 to 99.
const pairs = "00010203040506070809101112131415161718192021222324252627282930313233343536373839" +
	"40414243444546474849505152535455565758596061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

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
