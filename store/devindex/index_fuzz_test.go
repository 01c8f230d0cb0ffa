package devindex

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// FuzzDecodeEntry feeds arbitrary bytes to the device index record
// decoder: it never panics, a record whose checksum does not match is
// refused, and whatever it accepts encodes
// again (checksummed) into a record that decodes to the same entry.
// The seed corpus is in testdata/fuzz/FuzzDecodeEntry.
func FuzzDecodeEntry(f *testing.F) {
	e := &deviceEntry{first: 100, last: 200, at: []buckets.Ticks{150, 200},
		latest: []buckets.Field{{Name: "a", Value: buckets.Float(1.5)}, {Name: "b", Value: buckets.String("x")}}}
	rec := encodeEntry(nil, e)
	f.Add(rec)
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeEntry(b)
		if err != nil {
			return
		}
		n := len(b) - 4
		require.Equal(t, crc32.Checksum(b[:n], castagnoli), binary.BigEndian.Uint32(b[n:]), "a checksummed record decodes only when intact")
		again, err := decodeEntry(encodeEntry(nil, got))
		require.NoError(t, err)
		require.Equal(t, got, again)
	})
}

func TestDeviceRecordChecksum(t *testing.T) {
	e := &deviceEntry{first: 100, last: 200, at: []buckets.Ticks{200},
		latest: []buckets.Field{{Name: "a", Value: buckets.Int(3)}}}
	rec := encodeEntry(nil, e)
	got, err := decodeEntry(rec)
	require.NoError(t, err)
	require.Equal(t, e, got)
	for i := range len(rec) * 8 {
		bad := bytes.Clone(rec)
		bad[i/8] ^= 1 << (i % 8)
		_, err := decodeEntry(bad)
		require.Error(t, err, "bit %d flipped", i)
	}
}
