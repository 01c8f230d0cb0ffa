// Package lpwire is the message in which the line protocol door
// publishes a write: the accepted readings of one request for the
// devices of one partition, each device's as a payload of package
// wire, in one JetStream message. A 10,000-line request of a fleet
// thus costs the stream, the ingester and the store a message per
// partition, not one per device.
//
// Such a message carries the header Telemetry-Format: devices/1 (Header,
// Format) and is published on <prefix>.<partition>.<Token> with a
// stream per partition, or <prefix>.<Token> with one stream. Token is
// not a valid device ID, so no device's own subject is ever read as
// this form; the ingester reads a message in this form only on that
// subject, and only when every device in it belongs to the partition of
// the stream it came from.
//
// Layout (varints as encoding/binary's; every count and length bounded
// by what is left of the message):
//
//	version   byte, 1
//	devices   uvarint n (1..MaxDevices), then n times:
//	  device  uvarint length (1..buckets.MaxDeviceIDLen), bytes: a
//	          valid device ID (buckets.DeviceID.Validate)
//	  payload uvarint length (>= 1), bytes: that device's readings in
//	          the form of package wire (wire.Decode)
//
// Nothing may follow the last payload. A device may appear more than
// once (its readings split over payloads). The message ID the door
// publishes it with (Nats-Msg-Id) is ID of its subject and bytes: the
// same request sent again gives the same message, the door publishes it
// once, and no other content can have that ID.
package lpwire

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/wire"
)

// Header names the payload format of a message (the header of package
// wire); Format is its value for this package's form.
const (
	Header = wire.Header
	Format = "devices/1"
)

// Token stands in the subject where a device ID would: the underscore
// makes it an invalid device ID, so no device publishes on it.
const Token = "_lines"

// version is the first byte of a message: its layout.
const version = 1

// MaxDevices bounds the entries of one message.
const MaxDevices = 1 << 16

// minEntry is the fewest bytes an entry takes: two lengths, a device
// byte and a payload byte.
const minEntry = 4

// Entry is one device's payload in a message.
type Entry struct {
	Device  buckets.DeviceID
	Payload []byte // a payload of package wire
}

// EntrySize is the size an entry of device and payload adds to a
// message.
func EntrySize(device string, payload int) int {
	return uvarintLen(uint64(len(device))) + len(device) + uvarintLen(uint64(payload)) + payload
}

// HeadSize bounds the size of a message's head (version and count).
const HeadSize = 1 + binary.MaxVarintLen32

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// Append appends the message of entries (1 to MaxDevices, each a valid
// device ID and a non-empty payload) to dst.
func Append(dst []byte, entries []Entry) []byte {
	dst = append(dst, version)
	dst = binary.AppendUvarint(dst, uint64(len(entries)))
	for _, e := range entries {
		dst = binary.AppendUvarint(dst, uint64(len(e.Device)))
		dst = append(dst, e.Device...)
		dst = binary.AppendUvarint(dst, uint64(len(e.Payload)))
		dst = append(dst, e.Payload...)
	}
	return dst
}

// ID is the message ID of a message published on subject with data: a
// hash (SHA-256, 128 bits) of both.
func ID(subject string, data []byte) string {
	h := sha256.New()
	h.Write([]byte(subject))
	h.Write([]byte{0})
	h.Write(data)
	return "lpw-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// Entries checks the framing of a message and returns its entries; the
// payloads are slices of data, not yet decoded. The error is a
// *buckets.ValidationError with code invalid_payload (or
// invalid_device for an entry's device ID), naming the byte and the
// entry at fault.
func Entries(data []byte) ([]Entry, error) {
	d := decoder{data: data}
	if len(data) == 0 {
		return nil, d.fail(-1, "empty message")
	}
	if data[0] != version {
		return nil, d.fail(-1, "version %d, want %d", data[0], version)
	}
	d.pos = 1
	n, err := d.uvarint(-1, "device count", MaxDevices, minEntry)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, d.fail(-1, "no device")
	}
	entries := make([]Entry, n)
	for i := range entries {
		l, err := d.uvarint(i, "device length", buckets.MaxDeviceIDLen, 1)
		if err != nil {
			return nil, err
		}
		if l == 0 {
			return nil, d.fail(i, "empty device ID")
		}
		dev := buckets.DeviceID(data[d.pos : d.pos+l])
		if err := dev.Validate(); err != nil {
			return nil, buckets.Invalid(buckets.CodeInvalidDevice, -1, "device", "binary message at byte %d, device %d: %v", d.pos, i, err)
		}
		d.pos += l
		p, err := d.uvarint(i, "payload length", math.MaxInt32, 1)
		if err != nil {
			return nil, err
		}
		if p == 0 {
			return nil, d.fail(i, "empty payload of device %s", dev)
		}
		entries[i] = Entry{Device: dev, Payload: data[d.pos : d.pos+p : d.pos+p]}
		d.pos += p
	}
	if d.pos != len(data) {
		return nil, d.fail(-1, "%d bytes after the last device's payload", len(data)-d.pos)
	}
	return entries, nil
}

// Decode returns the readings and attribute assignments of a message,
// every device's in entry order, each decoded by wire.Decode for its
// device; accept, when not nil, is asked first about every device and
// its error (a *buckets.ValidationError) refuses the message. Every
// error is a *buckets.ValidationError; one of a device's payload names
// the device.
func Decode(data []byte, accept func(buckets.DeviceID) error) ([]buckets.Reading, []buckets.Assignment, error) {
	entries, err := Entries(data)
	if err != nil {
		return nil, nil, err
	}
	if accept != nil {
		for _, e := range entries {
			if err := accept(e.Device); err != nil {
				return nil, nil, err
			}
		}
	}
	var rs []buckets.Reading
	var as []buckets.Assignment
	for i, e := range entries {
		r, a, err := wire.Decode(e.Device, e.Payload)
		if err != nil {
			ve, ok := err.(*buckets.ValidationError)
			if !ok {
				return nil, nil, buckets.Invalid(buckets.CodeInvalidPayload, -1, "", "device %d (%s): %v", i, e.Device, err)
			}
			return nil, nil, &buckets.ValidationError{Code: ve.Code, Index: ve.Index, Field: ve.Field,
				Msg: fmt.Sprintf("device %d (%s): %s", i, e.Device, ve.Msg)}
		}
		if rs == nil {
			rs = r
		} else {
			rs = append(rs, r...)
		}
		as = append(as, a...)
	}
	return rs, as, nil
}

// Count is how many readings a message holds, 0 when it is malformed.
func Count(data []byte) int {
	entries, err := Entries(data)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		n += wire.Count(e.Payload)
	}
	return n
}

type decoder struct {
	data []byte
	pos  int
}

// fail is an invalid_payload error at the current byte; entry is the
// entry at fault or -1.
func (d *decoder) fail(entry int, format string, args ...any) *buckets.ValidationError {
	msg := fmt.Sprintf(format, args...)
	if entry >= 0 {
		msg = fmt.Sprintf("device %d: %s", entry, msg)
	}
	return buckets.Invalid(buckets.CodeInvalidPayload, -1, "", "binary message at byte %d: %s", d.pos, msg)
}

// uvarint reads a count or length v of at most limit, of which v times
// unit bytes must follow it.
func (d *decoder) uvarint(entry int, what string, limit, unit uint64) (int, *buckets.ValidationError) {
	v, n := binary.Uvarint(d.data[d.pos:])
	if n <= 0 {
		return 0, d.fail(entry, "%s: truncated or overlong varint", what)
	}
	d.pos += n
	limit = min(limit, uint64(len(d.data)-d.pos)/unit)
	if v > limit {
		return 0, d.fail(entry, "%s %d is more than %d", what, v, limit)
	}
	return int(v), nil
}
