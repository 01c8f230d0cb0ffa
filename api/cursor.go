package api

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"slices"

	"github.com/telemetryd/telemetryd/buckets"
)

// Cursors are opaque to clients: base64url (no padding) of
//
//	version byte (1), kind byte ('r' range, 'd' devices), payload,
//	HMAC-SHA256(key, everything before it) (32 bytes)
//
// A range payload pins the whole query: device, the resolved from and
// to, the order, the projected fields and the ticks of the last reading
// returned. Pinning from and to keeps the window from sliding while
// new readings arrive, so following next returns every matching
// reading exactly once. A devices payload holds the prefix and the last
// device returned.
//
// The MAC makes cursors integrity-checked, not secret: they hold
// nothing but the query itself.
const (
	cursorVersion     = 1
	cursorKindRange   = 'r'
	cursorKindDevices = 'd'
	cursorMACLen      = sha256.Size
	// maxCursorLen bounds the encoded cursor (252 projected names of 64
	// bytes fit comfortably).
	maxCursorLen = 32 << 10
)

// errCursorMalformed marks a cursor payload that does not decode.
var errCursorMalformed = errors.New("malformed")

// rangeCursor is the state of a paged range query.
type rangeCursor struct {
	Device buckets.DeviceID
	From   buckets.Ticks // inclusive, resolved
	To     buckets.Ticks // exclusive, resolved
	Order  buckets.Order
	Fields []string // sorted and unique; nil means all values
	Last   buckets.Ticks
}

// devicesCursor is the state of a paged device listing.
type devicesCursor struct {
	Prefix string
	Last   buckets.DeviceID
}

// cursorCodec signs and checks cursors with one HMAC key.
type cursorCodec struct{ key []byte }

func newCursorCodec(key []byte) cursorCodec {
	if len(key) == 0 {
		key = make([]byte, 32)
		_, _ = rand.Read(key) // never fails (crypto/rand)
	}
	return cursorCodec{key: slices.Clone(key)}
}

func (cc cursorCodec) mac(payload []byte) []byte {
	m := hmac.New(sha256.New, cc.key)
	m.Write(payload)
	return m.Sum(nil)
}

// seal appends the MAC to payload and encodes the result.
func (cc cursorCodec) seal(payload []byte) string {
	return base64.RawURLEncoding.EncodeToString(append(payload, cc.mac(payload)...))
}

// open decodes s, checks its MAC, version and kind, and returns the
// payload behind the kind byte. The error is an apiError naming cursor.
func (cc cursorCodec) open(s string, kind byte) ([]byte, error) {
	if len(s) > maxCursorLen {
		return nil, invalidArg("cursor", "malformed (longer than %d characters)", maxCursorLen)
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(b) < 2+cursorMACLen {
		return nil, invalidArg("cursor", "malformed; pass the next value of the previous page unchanged")
	}
	payload, sum := b[:len(b)-cursorMACLen], b[len(b)-cursorMACLen:]
	if !hmac.Equal(sum, cc.mac(payload)) {
		return nil, invalidArg("cursor", "failed its integrity check; it was altered or signed with another key")
	}
	if payload[0] != cursorVersion {
		return nil, invalidArg("cursor", "version %d is not supported", payload[0])
	}
	if payload[1] != kind {
		return nil, invalidArg("cursor", "belongs to another kind of query")
	}
	return payload[2:], nil
}

func appendBytes(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// encodeRange returns the cursor string of c.
func (cc cursorCodec) encodeRange(c rangeCursor) string {
	b := make([]byte, 0, 64+len(c.Device)+16*len(c.Fields))
	b = append(b, cursorVersion, cursorKindRange)
	b = appendBytes(b, string(c.Device))
	b = binary.BigEndian.AppendUint64(b, uint64(c.From))
	b = binary.BigEndian.AppendUint64(b, uint64(c.To))
	b = append(b, byte(c.Order))
	b = binary.AppendUvarint(b, uint64(len(c.Fields)))
	for _, f := range c.Fields {
		b = appendBytes(b, f)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(c.Last))
	return cc.seal(b)
}

// decodeRange checks and decodes a range cursor. Even with a valid MAC
// every field is checked, so a leaked key cannot crash a handler.
func (cc cursorCodec) decodeRange(s string) (rangeCursor, error) {
	p, err := cc.open(s, cursorKindRange)
	if err != nil {
		return rangeCursor{}, err
	}
	r := cursorReader{b: p}
	var c rangeCursor
	c.Device = buckets.DeviceID(r.str())
	c.From = buckets.Ticks(r.u64())
	c.To = buckets.Ticks(r.u64())
	c.Order = buckets.Order(r.byte())
	n := r.uvarint()
	if n > buckets.MaxValues {
		r.err = errCursorMalformed
	}
	for i := uint64(0); i < n && r.err == nil; i++ {
		c.Fields = append(c.Fields, r.str())
	}
	c.Last = buckets.Ticks(r.u64())
	if r.err != nil || len(r.b) != 0 || c.Device.Validate() != nil ||
		!c.From.Valid() || !c.To.Valid() || c.From >= c.To || c.Order > buckets.Asc ||
		c.Last < c.From || c.Last >= c.To || !validFieldList(c.Fields) {
		return rangeCursor{}, invalidArg("cursor", "malformed; pass the next value of the previous page unchanged")
	}
	return c, nil
}

// encodeDevices returns the cursor string of c.
func (cc cursorCodec) encodeDevices(c devicesCursor) string {
	b := make([]byte, 0, 8+len(c.Prefix)+len(c.Last))
	b = append(b, cursorVersion, cursorKindDevices)
	b = appendBytes(b, c.Prefix)
	b = appendBytes(b, string(c.Last))
	return cc.seal(b)
}

// decodeDevices checks and decodes a devices cursor.
func (cc cursorCodec) decodeDevices(s string) (devicesCursor, error) {
	p, err := cc.open(s, cursorKindDevices)
	if err != nil {
		return devicesCursor{}, err
	}
	r := cursorReader{b: p}
	c := devicesCursor{Prefix: r.str(), Last: buckets.DeviceID(r.str())}
	if r.err != nil || len(r.b) != 0 || c.Last.Validate() != nil || validPrefix(c.Prefix) != nil {
		return devicesCursor{}, invalidArg("cursor", "malformed; pass the next value of the previous page unchanged")
	}
	return c, nil
}

// validFieldList reports whether fields is a sorted list of unique,
// valid value names.
func validFieldList(fields []string) bool {
	for i, f := range fields {
		if buckets.ValidateValueName(f) != nil || (i > 0 && fields[i-1] >= f) {
			return false
		}
	}
	return true
}

// cursorReader reads a cursor payload, remembering the first failure.
type cursorReader struct {
	b   []byte
	err error
}

func (r *cursorReader) fail() { r.err, r.b = errCursorMalformed, nil }

func (r *cursorReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *cursorReader) str() string {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.fail()
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *cursorReader) u64() uint64 {
	if len(r.b) < 8 {
		r.fail()
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *cursorReader) byte() byte {
	if len(r.b) < 1 {
		r.fail()
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}
