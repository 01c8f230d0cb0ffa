package lineproto

import (
	"bytes"
	"iter"
)

// rawLine is one entry of a body: its text (without the line end) and
// the 1-based number of the physical line it starts on.
type rawLine struct {
	number int
	text   []byte
}

// splitLines yields the entries of body, skipping blank and comment
// lines. An entry ends at a newline outside a string field value (a
// string may hold a raw newline); a trailing carriage return is
// dropped.
func splitLines(body []byte) iter.Seq[rawLine] {
	return func(yield func(rawLine) bool) {
		number := 1
		for len(body) > 0 {
			n, newlines := entryEnd(body)
			text := body[:n]
			start := number
			number += newlines
			if n < len(body) { // the '\n' that ended it
				n++
				number++
			}
			body = body[n:]
			text = bytes.TrimSuffix(text, []byte{'\r'})
			trimmed := bytes.TrimLeft(text, " \t")
			if len(bytes.TrimSpace(trimmed)) == 0 || trimmed[0] == '#' {
				continue
			}
			if !yield(rawLine{number: start, text: text}) {
				return
			}
		}
	}
}

// entryEnd returns the length of the first entry of b (up to, not
// including, its ending newline) and how many newlines it contains
// (inside string values).
func entryEnd(b []byte) (n, newlines int) {
	const (
		keys   = iota // measurement and tags
		fields        // field set
		stamp         // timestamp
	)
	phase, inString := keys, false
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	for ; i < len(b); i++ {
		switch c := b[i]; {
		case c == '\\' && i+1 < len(b) && b[i+1] != '\n':
			i++ // escaped byte
		case c == '\n':
			if !inString {
				return i, newlines
			}
			newlines++
		case inString:
			if c == '"' {
				inString = false
			}
		case c == '"' && phase == fields:
			inString = true
		case c == ' ' && phase == keys:
			phase = fields
		case c == ' ' && phase == fields:
			phase = stamp
		}
	}
	return len(b), newlines
}
