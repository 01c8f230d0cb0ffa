package buckets_test

import (
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

// FuzzRowKey checks the row key: round trips and its newest-first
// order.
//
//	go test -fuzz=FuzzRowKey ./buckets
func FuzzRowKey(f *testing.F) {
	f.Add(int64(exampleTicks), int64(exampleTicks)+1)
	f.Add(int64(0), int64(buckets.MaxTicks))
	f.Add(int64(-1), int64(1))
	f.Fuzz(func(t *testing.T, x, y int64) {
		a, b := validTicks(x), validTicks(y)
		if a > b {
			a, b = b, a
		}
		for _, k := range []buckets.Ticks{a, b} {
			back, err := buckets.ParseRowKey(k.RowKey())
			require.NoError(t, err)
			require.Equal(t, k, back)
		}
		if a < b {
			require.Less(t, b.RowKey(), a.RowKey(), "newer %d must sort before older %d", b, a)
		} else {
			require.Equal(t, a.RowKey(), b.RowKey())
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
