package lineproto

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/buckets/wire"
)

// maxHeaderValue bounds linemsg.Message.Reason (it travels as a header).
const maxHeaderValue = 1024

// build encodes the merged readings: per device (in first-seen order)
// one message of its readings in time order (the first one also with
// the device's attribute assignments), in the binary form of
// package wire (the ingester decodes it two to three times cheaper
// than JSON), split where a message would pass buckets.MaxBatch readings or
// MaxMessageBytes.
func (m *mapper) build() {
	enc := &m.enc
	hdr := map[string]string{wire.Header: wire.Format}
	// Every payload goes into one buffer, sliced once it stops growing.
	type span struct{ start, end int }
	var buf []byte
	var spans []span
	for i := range m.devices {
		d := &m.devices[i]
		rs := d.readings
		if d.unsorted {
			slices.SortFunc(rs, func(a, b int32) int { return cmp.Compare(m.pending[a].ticks, m.pending[b].ticks) })
		}
		enc.Reset()
		// The device's attributes go in its first message.
		for _, a := range m.assignments(d, rs) {
			enc.Assign(a.at, a.set)
		}
		flush := func() {
			if enc.Len() == 0 {
				return
			}
			start := len(buf)
			buf = enc.Append(buf)
			spans = append(spans, span{start, len(buf)})
			m.res.Messages = append(m.res.Messages, linemsg.Message{Device: string(d.id), Header: hdr})
			enc.Reset()
		}
		for _, pi := range rs {
			p := &m.pending[pi]
			if enc.Len() > 0 && (enc.Len() == buckets.MaxBatch || enc.Size()+wire.AddSize(p.fields) > m.opts.MaxMessageBytes) {
				flush()
			}
			if buf == nil {
				buf = make([]byte, 0, m.outHint)
			}
			enc.Add(p.ticks, p.fields)
			m.res.Readings++
		}
		flush()
	}
	for i, sp := range spans {
		msg := &m.res.Messages[i]
		msg.Data = buf[sp.start:sp.end:sp.end]
	}
}

// msgID is a Nats-Msg-Id naming the content of a dead letter: the
// same request sent again produces the same IDs.
func msgID(name string, data []byte, extra ...string) string {
	h := sha256.New()
	h.Write([]byte(name))
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
