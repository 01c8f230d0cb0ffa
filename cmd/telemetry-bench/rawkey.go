package main

import (
	"encoding/binary"

	"github.com/telemetryd/telemetryd/buckets"
)

// The raw Badger baseline stores one entry per reading, in the layout
// the store used before blocks: the key of a reading in a day table is
//
//	<device> '/' <inverted ticks, 8 bytes big-endian>
//
// Device IDs cannot contain '/', so the prefix "<device>/" never
// matches another device, and because the ticks are inverted a forward
// scan of the prefix returns the device's newest reading first.

// rawPrefix is the key prefix of every reading of device.
func rawPrefix(device buckets.DeviceID) []byte {
	p := make([]byte, 0, len(device)+1)
	return append(append(p, device...), '/')
}

// appendRawKey appends the key of (device, ticks) to dst.
func appendRawKey(dst []byte, device buckets.DeviceID, k buckets.Ticks) []byte {
	dst = append(dst, device...)
	dst = append(dst, '/')
	return binary.BigEndian.AppendUint64(dst, k.Inverted())
}
