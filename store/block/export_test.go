package block

import (
	"encoding/binary"
	"hash/crc32"
)

// Reseal returns a copy of b, taken as a block of Version, with its
// checksum made to match its bytes, so that the fuzzer reaches the
// decoder behind the checksum.
func Reseal(b []byte) []byte {
	if len(b) < 1+checksumLen+1 {
		return append([]byte(nil), b...)
	}
	out := append([]byte(nil), b...)
	out[0] = Version
	n := len(out) - checksumLen
	binary.BigEndian.PutUint32(out[n:], crc32.Checksum(out[:n], castagnoli))
	return out
}
