package buckets_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// validTicks maps any int64 onto 0..MaxTicks.
func validTicks(x int64) buckets.Ticks {
	return buckets.Ticks(uint64(x) % (uint64(buckets.MaxTicks) + 1))
}

// FuzzKeyCodec checks the storage key and row key: round trips, the
// newest-first order of both, and that ParseKey never panics and only
// accepts bytes AppendKey could have written.
//
//	go test -fuzz=FuzzKeyCodec ./buckets
func FuzzKeyCodec(f *testing.F) {
	f.Add("dev-1", int64(exampleTicks), int64(exampleTicks)+1, buckets.AppendKey(nil, "dev-1", exampleTicks))
	f.Add("a", int64(0), int64(buckets.MaxTicks), []byte("a/"))
	f.Add("ab", int64(-1), int64(1), []byte{})
	f.Fuzz(func(t *testing.T, device string, x, y int64, raw []byte) {
		// ParseKey on arbitrary bytes: no panic, and a success must be
		// the exact encoding of what it returned.
		if d, k, err := buckets.ParseKey(raw); err == nil {
			require.True(t, k.Valid())
			require.Equal(t, raw, buckets.AppendKey(nil, d, k))
		}

		dev := buckets.DeviceID(device)
		if dev.Validate() != nil {
			return
		}
		a, b := validTicks(x), validTicks(y)
		if a > b {
			a, b = b, a
		}
		keyA, keyB := buckets.AppendKey(nil, dev, a), buckets.AppendKey(nil, dev, b)
		for _, c := range []struct {
			key []byte
			k   buckets.Ticks
		}{{keyA, a}, {keyB, b}} {
			gotDev, gotTicks, err := buckets.ParseKey(c.key)
			require.NoError(t, err)
			require.Equal(t, dev, gotDev)
			require.Equal(t, c.k, gotTicks)
			require.True(t, bytes.HasPrefix(c.key, buckets.DevicePrefix(dev)))

			back, err := buckets.ParseRowKey(c.k.RowKey())
			require.NoError(t, err)
			require.Equal(t, c.k, back)
		}
		if a < b {
			require.Negative(t, bytes.Compare(keyB, keyA), "newer %d must sort before older %d", b, a)
			require.Less(t, b.RowKey(), a.RowKey())
		} else {
			require.Equal(t, keyA, keyB)
		}
	})
}

// FuzzValueCodec checks that DecodeValues never panics on arbitrary
// bytes, and that whatever it decodes encodes and decodes back to the
// same fields, with a stable encoding.
//
//	go test -fuzz=FuzzValueCodec ./buckets
func FuzzValueCodec(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 0})
	f.Add(buckets.AppendValues(nil, []buckets.Field{
		{Name: "a", Value: buckets.Float(1.5)},
		{Name: "b", Value: buckets.String("x\x00y")},
		{Name: "c", Value: buckets.Int(math.MinInt64)},
		{Name: "d", Value: buckets.Bool(true)},
		{Name: "e", Value: buckets.Float(1 << 53)},
	}))
	f.Add(binary.AppendVarint([]byte{1, 1, 1, 'x', 6}, math.MaxInt64)) // non-canonical float
	f.Fuzz(func(t *testing.T, data []byte) {
		fields, err := buckets.DecodeValues(data)
		if err != nil {
			require.Nil(t, fields)
			return
		}
		enc := buckets.AppendValues(nil, fields)
		again, err := buckets.DecodeValues(enc)
		require.NoError(t, err)
		require.Len(t, again, len(fields))
		if len(fields) > 0 {
			// DeepEqual on Value compares float bits: -0 stays -0.
			assert.Equal(t, fields, again)
		}
		require.Equal(t, enc, buckets.AppendValues(nil, again), "encoding is stable")
		require.LessOrEqual(t, len(enc), len(data), "the canonical encoding is never longer")
	})
}
