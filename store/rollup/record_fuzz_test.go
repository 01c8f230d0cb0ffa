package rollup

import (
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzDecodeRecord checks that decodeRecord never panics on a record
// whose checksum holds, whatever its body, that every error it gives
// wraps ErrCorrupt, and that the buckets it accepts encode and decode
// back to the same buckets.
//
//	go test -fuzz=FuzzDecodeRecord ./store/rollup
func FuzzDecodeRecord(f *testing.F) {
	golden, err := hex.DecodeString(goldenRecord)
	require.NoError(f, err)
	f.Add(golden[:len(golden)-4])
	f.Add([]byte{1})
	f.Add([]byte{1, 0})
	f.Add([]byte{1, 1, 0, 1, 1, 0, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00})
	iv, span := goldenLevel.ticks(), goldenLevel.span()
	decode := func(v []byte) ([]Bucket, error) {
		var got []Bucket
		err := decodeRecord(v, goldenStart, iv, span, &decoder{}, func(b Bucket) error { got = append(got, b); return nil })
		return got, err
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		v := binary.BigEndian.AppendUint32(append([]byte(nil), body...), crc32.Checksum(body, castagnoli))
		got, err := decode(v)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		again, err := decode(appendRecord(nil, goldenStart, iv, got))
		require.NoError(t, err)
		assert.Equal(t, bitsOf(got), bitsOf(again))
	})
}
