package ingest

import (
	"math"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/telemetryd/telemetryd/buckets"
)

// The scanning primitives of decoder. Each starts at d.pos (the first
// byte of the token, whitespace already skipped) and leaves d.pos just
// past the token. They accept exactly the JSON grammar of RFC 8259.

func (d *decoder) skipWS() {
	for d.pos < len(d.buf) {
		switch d.buf[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// key reads an object key. The result is valid until the next key.
func (d *decoder) key() ([]byte, *buckets.ValidationError) { return d.readString(&d.keyBuf) }

// str reads a string value. The result is valid until the next str.
func (d *decoder) str() ([]byte, *buckets.ValidationError) { return d.readString(&d.strBuf) }

// readString reads a quoted string. Without escapes it returns a view
// into the payload; otherwise it unescapes into *buf.
func (d *decoder) readString(buf *[]byte) ([]byte, *buckets.ValidationError) {
	start := d.pos + 1
	for i := start; i < len(d.buf); i++ {
		switch c := d.buf[i]; {
		case c == '"':
			d.pos = i + 1
			return d.buf[start:i], nil
		case c == '\\':
			return d.unescape(buf, start, i)
		case c < 0x20:
			d.pos = i
			return nil, d.syntax("an escaped control character")
		}
	}
	d.pos = len(d.buf)
	return nil, d.syntax("closing '\"'")
}

// unescape continues readString at the first backslash, at i.
func (d *decoder) unescape(buf *[]byte, start, i int) ([]byte, *buckets.ValidationError) {
	out := append((*buf)[:0], d.buf[start:i]...)
	defer func() { *buf = out[:0] }()
	for i < len(d.buf) {
		c := d.buf[i]
		switch {
		case c == '"':
			d.pos = i + 1
			return out, nil
		case c < 0x20:
			d.pos = i
			return nil, d.syntax("an escaped control character")
		case c != '\\':
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(d.buf) {
			break
		}
		switch e := d.buf[i+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, n := d.unicodeEscape(i)
			if n == 0 {
				d.pos = i
				return nil, d.syntax("four hex digits after \\u")
			}
			out = utf8.AppendRune(out, r)
			i += n
			continue
		default:
			d.pos = i
			return nil, d.syntax("a valid escape sequence")
		}
		i += 2
	}
	d.pos = len(d.buf)
	return nil, d.syntax("closing '\"'")
}

// unicodeEscape decodes \uXXXX at i, pairing surrogates. It returns the
// rune and the bytes consumed, 0 when malformed. Unpaired surrogates
// become U+FFFD, as encoding/json does.
func (d *decoder) unicodeEscape(i int) (rune, int) {
	r := hex4(d.buf, i+2)
	if r < 0 {
		return 0, 0
	}
	if !utf16.IsSurrogate(r) {
		return r, 6
	}
	if i+7 < len(d.buf) && d.buf[i+6] == '\\' && d.buf[i+7] == 'u' {
		if r2 := hex4(d.buf, i+8); r2 >= 0 {
			if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
				return dec, 12
			}
		}
	}
	return utf8.RuneError, 6
}

// hex4 parses four hex digits at b[i:], -1 when malformed.
func hex4(b []byte, i int) rune {
	if i+4 > len(b) {
		return -1
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// number reads a number literal and reports whether it is an integer
// (no fraction, no exponent).
func (d *decoder) number() (lit []byte, isInt bool, err *buckets.ValidationError) {
	start, i := d.pos, d.pos
	if i < len(d.buf) && d.buf[i] == '-' {
		i++
	}
	switch {
	case i < len(d.buf) && d.buf[i] == '0':
		i++
	case i < len(d.buf) && d.buf[i] >= '1' && d.buf[i] <= '9':
		i = d.digits(i)
	default:
		d.pos = i
		return nil, false, d.syntax("a digit")
	}
	isInt = true
	if i < len(d.buf) && d.buf[i] == '.' {
		isInt = false
		if i++; i >= len(d.buf) || !isDigit(d.buf[i]) {
			d.pos = i
			return nil, false, d.syntax("a digit after '.'")
		}
		i = d.digits(i)
	}
	if i < len(d.buf) && (d.buf[i] == 'e' || d.buf[i] == 'E') {
		isInt = false
		if i++; i < len(d.buf) && (d.buf[i] == '+' || d.buf[i] == '-') {
			i++
		}
		if i >= len(d.buf) || !isDigit(d.buf[i]) {
			d.pos = i
			return nil, false, d.syntax("a digit in the exponent")
		}
		i = d.digits(i)
	}
	d.pos = i
	return d.buf[start:i], isInt, nil
}

func (d *decoder) digits(i int) int {
	for i < len(d.buf) && isDigit(d.buf[i]) {
		i++
	}
	return i
}

// parseInt64 parses an integer literal that number accepted; ok is
// false when it does not fit an int64.
func parseInt64(lit []byte) (int64, bool) {
	neg := lit[0] == '-'
	digits := lit
	if neg {
		digits = lit[1:]
	}
	if len(digits) > 19 {
		return 0, false
	}
	var u uint64 // 19 digits never overflow a uint64
	for _, c := range digits {
		u = u*10 + uint64(c-'0')
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return int64(-u), true //nolint:gosec // -2^63 wraps to itself, as intended
	}
	if u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}

// boolean reads true or false.
func (d *decoder) boolean() (bool, *buckets.ValidationError) {
	if d.literal("true") {
		return true, nil
	}
	if d.literal("false") {
		return false, nil
	}
	return false, d.syntax("a value")
}

func (d *decoder) literal(word string) bool {
	if len(d.buf)-d.pos >= len(word) && string(d.buf[d.pos:d.pos+len(word)]) == word {
		d.pos += len(word)
		return true
	}
	return false
}
