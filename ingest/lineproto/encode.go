package lineproto

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/telemetryd/telemetryd/buckets"
)

// maxHeaderValue bounds the Telemetry-Error header.
const maxHeaderValue = 1024

// build encodes the merged readings: per device (in first-seen order)
// a JSON batch of its readings in time order, split where a batch
// would pass buckets.MaxBatch readings or MaxMessageBytes.
func (m *mapper) build() {
	var buf, one []byte
	for _, d := range m.devices {
		subject := m.opts.SubjectPrefix + "." + string(d.id)
		rs := d.readings
		slices.SortFunc(rs, func(a, b int32) int { return cmp.Compare(m.pending[a].ticks, m.pending[b].ticks) })
		buf = buf[:0]
		n := 0
		flush := func() {
			if n == 0 {
				return
			}
			buf = append(buf, ']')
			data := slices.Clone(buf)
			m.res.Messages = append(m.res.Messages, Message{Subject: subject, Data: data, MsgID: msgID(subject, data)})
			buf, n = buf[:0], 0
		}
		for _, pi := range rs {
			p := &m.pending[pi]
			one = appendReading(one[:0], p.ticks, p.fields)
			if n > 0 && (n == buckets.MaxBatch || len(buf)+1+len(one)+1 > m.opts.MaxMessageBytes) {
				flush()
			}
			if n == 0 {
				buf = append(buf, '[')
			} else {
				buf = append(buf, ',')
			}
			buf = append(buf, one...)
			n++
			m.res.Readings++
		}
		flush()
	}
}

// appendReading appends {"ts":"<RFC 3339>","values":{...}}.
func appendReading(b []byte, k buckets.Ticks, fields []buckets.Field) []byte {
	b = append(b, `{"ts":`...)
	b = appendTS(b, k)
	b = append(b, `,"values":{`...)
	for i, f := range fields {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, f.Name...) // value names need no escaping
		b = append(b, `":`...)
		b = appendValue(b, f.Value)
	}
	return append(b, "}}"...)
}

// ticksPerMilli is the number of ticks in a millisecond.
const ticksPerMilli = buckets.TicksPerSecond / 1000

// appendTS appends the time of k: epoch milliseconds when k is a whole
// millisecond (cheaper to write and to read back), else RFC 3339 with
// the 100 ns digits.
func appendTS(b []byte, k buckets.Ticks) []byte {
	if k%ticksPerMilli == 0 {
		if ms := k.Time().UnixMilli(); ms >= 0 {
			return strconv.AppendInt(b, ms, 10)
		}
	}
	b = append(b, '"')
	b = k.Time().AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendValue appends v as JSON the ingester decodes back to the same
// kind: a float always carries a '.' or an exponent.
func appendValue(b []byte, v buckets.Value) []byte {
	switch v.Kind {
	case buckets.KindFloat:
		start := len(b)
		b = strconv.AppendFloat(b, v.AsFloat(), 'g', -1, 64)
		if !strings.ContainsAny(string(b[start:]), ".e") {
			b = append(b, ".0"...)
		}
		return b
	case buckets.KindInt:
		return strconv.AppendInt(b, v.AsInt(), 10)
	case buckets.KindBool:
		return strconv.AppendBool(b, v.AsBool())
	default:
		return appendString(b, v.AsString())
	}
}

// appendString appends s as a JSON string.
func appendString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			switch c {
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// msgID is a Nats-Msg-Id naming the content of a message: the same
// request sent again produces the same IDs.
func msgID(subject string, data []byte, extra ...string) string {
	h := sha256.New()
	h.Write([]byte(subject))
	h.Write([]byte{0})
	h.Write(data)
	for _, p := range extra {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return "lp-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// headerValue makes s safe as a header value: control characters are
// escaped, invalid UTF-8 replaced, the result cut to maxHeaderValue.
func headerValue(s string) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, string(utf8.RuneError)) {
		if b.Len() >= maxHeaderValue {
			b.WriteString("...")
			break
		}
		if r < 0x20 || r == 0x7f {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
