package api

import (
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"time"

	"golang.org/x/crypto/chacha20poly1305"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/binread"
)

// Cursors are opaque to clients: base64url (no padding) of
//
//	version byte (2), kind byte ('r' range, 'd' devices),
//	nonce (24 bytes: HMAC-SHA256(nonce key, version, kind, payload)),
//	XChaCha20-Poly1305(key, nonce, payload, additional data: version and kind)
//
// A range payload pins the whole query: device, the resolved from and
// to, the order, the projected fields and the ticks of the last reading
// returned. Pinning from and to keeps the window from sliding while
// new readings arrive, so following next returns every matching
// reading exactly once. A devices payload holds the prefix, the
// position in the device index (the last device read, which may be one
// the page left out: a listing of silent devices ends a page after
// maxDeviceScan devices of the index, so that paging always moves on)
// and the filter: the match parameter and the silence bounds resolved
// when the listing began.
//
// Cursors are sealed, not merely signed: the payload is encrypted and
// authenticated, so a client can neither alter a cursor nor read
// anything out of it (a devices cursor's position is padded to the
// longest device ID, so not even its length shows). The nonce is a MAC
// of the cursor (the synthetic-IV construction), so sealing is
// deterministic: the same state always gives the same cursor, on every
// node, which tells a client only what it knows (that it asked the
// same). Both keys are derived from Config.CursorKey; nodes that share
// it continue each other's cursors.
const (
	cursorVersion     = 2
	cursorKindRange   = 'r'
	cursorKindDevices = 'd'
	cursorHeaderLen   = 2
	// maxCursorLen bounds the encoded cursor (252 projected names of 64
	// bytes fit comfortably).
	maxCursorLen = 32 << 10
	// cursorKeyInfo and cursorNonceInfo separate the cursor keys from
	// each other and from other keys derived from the same secret.
	cursorKeyInfo   = "telemetryd cursor v2"
	cursorNonceInfo = "telemetryd cursor nonce v2"
)

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
	Last   buckets.DeviceID // position in the index: the last device read
	Filter deviceFilter
}

// deviceFilter is what a device listing keeps besides the prefix: the
// attribute matchers as given, and for silent devices the duration and
// the times it resolved to when the listing began.
type deviceFilter struct {
	Match        string
	SilentFor    time.Duration
	SilentBefore buckets.Ticks // keeps devices last seen before it
	Since        buckets.Ticks // and not before it (the retention)
}

// cursorCodec seals and opens cursors.
type cursorCodec struct {
	aead     cipher.AEAD
	nonceKey []byte
}

// newCursorCodec derives the cursor key from secret (a random one when
// secret is empty: cursors then last as long as the process).
func newCursorCodec(secret []byte) cursorCodec {
	if len(secret) == 0 {
		secret = make([]byte, 32)
		_, _ = rand.Read(secret) // never fails (crypto/rand)
	}
	key, err := hkdf.Key(sha256.New, secret, nil, cursorKeyInfo, chacha20poly1305.KeySize)
	if err != nil {
		panic("cursor key: " + err.Error()) // only for a key length HKDF cannot make
	}
	nonceKey, err := hkdf.Key(sha256.New, secret, nil, cursorNonceInfo, sha256.Size)
	if err != nil {
		panic("cursor key: " + err.Error())
	}
	aead, err := chacha20poly1305.NewX(key)
	if err != nil {
		panic("cursor key: " + err.Error()) // only for a wrong key size
	}
	return cursorCodec{aead: aead, nonceKey: nonceKey}
}

// seal encrypts a cursor (version and kind byte, then the payload)
// and encodes the result.
func (cc cursorCodec) seal(cursor []byte) string {
	ns := cc.aead.NonceSize()
	header, payload := cursor[:cursorHeaderLen], cursor[cursorHeaderLen:]
	m := hmac.New(sha256.New, cc.nonceKey)
	m.Write(cursor)
	b := make([]byte, cursorHeaderLen, cursorHeaderLen+ns+len(payload)+cc.aead.Overhead())
	copy(b, header)
	b = append(b, m.Sum(nil)[:ns]...)
	b = cc.aead.Seal(b, b[cursorHeaderLen:], payload, header)
	return base64.RawURLEncoding.EncodeToString(b)
}

// open decodes s, checks its version, authenticity and kind, and
// returns the payload. The error is an apiError naming cursor.
func (cc cursorCodec) open(s string, kind byte) ([]byte, error) {
	if len(s) > maxCursorLen {
		return nil, invalidArg("cursor", "malformed (longer than %d characters)", maxCursorLen)
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	ns := cc.aead.NonceSize()
	if err != nil || len(b) < cursorHeaderLen {
		return nil, invalidArg("cursor", "malformed; pass the next value of the previous page unchanged")
	}
	if b[0] != cursorVersion {
		return nil, invalidArg("cursor", "version %d is not supported; start the listing again without a cursor", b[0])
	}
	if len(b) < cursorHeaderLen+ns+cc.aead.Overhead() {
		return nil, invalidArg("cursor", "malformed; pass the next value of the previous page unchanged")
	}
	header, nonce, sealed := b[:cursorHeaderLen], b[cursorHeaderLen:cursorHeaderLen+ns], b[cursorHeaderLen+ns:]
	payload, err := cc.aead.Open(nil, nonce, sealed, header)
	if err != nil {
		return nil, invalidArg("cursor", "failed its integrity check; it was altered or signed with another key")
	}
	if header[1] != kind {
		return nil, invalidArg("cursor", "belongs to another kind of query")
	}
	return payload, nil
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
	r := newCursorReader(p)
	var c rangeCursor
	c.Device = buckets.DeviceID(r.str())
	c.From = buckets.Ticks(r.u64())
	c.To = buckets.Ticks(r.u64())
	c.Order = buckets.Order(r.Byte())
	n := r.Uvarint()
	if n > buckets.MaxValues {
		r.Fail()
	}
	for i := uint64(0); i < n && !r.Failed(); i++ {
		c.Fields = append(c.Fields, r.str())
	}
	c.Last = buckets.Ticks(r.u64())
	if r.Failed() || r.Len() != 0 || c.Device.Validate() != nil ||
		!c.From.Valid() || !c.To.Valid() || c.From >= c.To || c.Order > buckets.Asc ||
		c.Last < c.From || c.Last >= c.To || !validFieldList(c.Fields) {
		return rangeCursor{}, invalidArg("cursor", "malformed; pass the next value of the previous page unchanged")
	}
	return c, nil
}

// encodeDevices returns the cursor string of c. The position takes
// buckets.MaxDeviceIDLen bytes whatever its length, so the cursor's
// length tells nothing of it. The filter follows the position, only
// when there is one (so cursors of plain listings keep their form).
func (cc cursorCodec) encodeDevices(c devicesCursor) string {
	b := make([]byte, 0, 8+len(c.Prefix)+1+buckets.MaxDeviceIDLen+len(c.Filter.Match)+32)
	b = append(b, cursorVersion, cursorKindDevices)
	b = appendBytes(b, c.Prefix)
	b = append(b, byte(len(c.Last)))
	b = append(b, c.Last...)
	b = append(b, make([]byte, max(0, buckets.MaxDeviceIDLen-len(c.Last)))...)
	if f := c.Filter; f != (deviceFilter{}) {
		b = appendBytes(b, f.Match)
		b = binary.BigEndian.AppendUint64(b, uint64(f.SilentFor))
		b = binary.BigEndian.AppendUint64(b, uint64(f.SilentBefore))
		b = binary.BigEndian.AppendUint64(b, uint64(f.Since))
	}
	return cc.seal(b)
}

// decodeDevices checks and decodes a devices cursor.
func (cc cursorCodec) decodeDevices(s string) (devicesCursor, error) {
	p, err := cc.open(s, cursorKindDevices)
	if err != nil {
		return devicesCursor{}, err
	}
	r := newCursorReader(p)
	c := devicesCursor{Prefix: r.str()}
	n := int(r.Byte())
	if slot := r.Bytes(buckets.MaxDeviceIDLen); slot != nil && n <= buckets.MaxDeviceIDLen {
		c.Last = buckets.DeviceID(slot[:n])
	} else {
		r.Fail()
	}
	if !r.Failed() && r.Len() > 0 {
		f := &c.Filter
		f.Match = r.str()
		f.SilentFor = time.Duration(r.u64())
		f.SilentBefore = buckets.Ticks(r.u64())
		f.Since = buckets.Ticks(r.u64())
		if len(f.Match) > maxMatchBytes || f.SilentFor < 0 || !f.SilentBefore.Valid() || !f.Since.Valid() {
			r.Fail()
		}
	}
	if r.Failed() || r.Len() != 0 || c.Last.Validate() != nil || validPrefix(c.Prefix) != nil {
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

// cursorReader reads a cursor payload (binread's Reader, which
// remembers the first failure): strings are length-prefixed, integers
// 8 bytes big endian.
type cursorReader struct{ binread.Reader }

func newCursorReader(p []byte) *cursorReader { return &cursorReader{binread.NewReader(p)} }

func (r *cursorReader) str() string { return string(r.Bytes(r.Uvarint())) }

func (r *cursorReader) u64() uint64 {
	if b := r.Bytes(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}
