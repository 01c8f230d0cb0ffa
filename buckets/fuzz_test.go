package buckets_test

import (
	"testing"

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
