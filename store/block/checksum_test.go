package block_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
)

// readAll reads b through every reader of the package and returns
// their errors, and how many values the header-only and column readers
// handed out before failing.
func readAll(t *testing.T, b []byte) (errs map[string]error, calls int) {
	t.Helper()
	var sc block.Scanner
	errs = map[string]error{}
	_, _, errs["Decode"] = block.Decode(b, "dev-1")
	_, errs["ReadHeader"] = block.ReadHeader(b)
	_, _, errs["EachSummary"] = block.EachSummary(b, func([]byte, buckets.Summary) { calls++ })
	errs["Numeric"] = sc.Numeric(b, func([]byte) bool { return true }, func([]byte, []buckets.Ticks, []float64) { calls++ })
	_, errs["Readings"] = sc.Readings(b, "dev-1", 0, buckets.MaxTicks+1, 0, true)
	return errs, calls
}

func TestEveryFlippedBitIsCaughtBeforeAnyValueIsRead(t *testing.T) {
	for name, rs := range map[string][]buckets.Reading{"raw columns": series(3, 1), "zstd columns": series(300, 2)} {
		t.Run(name, func(t *testing.T) {
			b, err := block.Encode(nil, rs)
			require.NoError(t, err)
			require.Equal(t, byte(block.Version), b[0])
			require.True(t, block.Checksummed(b))
			for i := range len(b) * 8 {
				damaged := bytes.Clone(b)
				damaged[i/8] ^= 1 << (i % 8)
				errs, calls := readAll(t, damaged)
				for reader, err := range errs {
					require.Error(t, err, "%s accepted the block with bit %d flipped", reader, i)
					if i >= 8 {
						require.ErrorIs(t, err, block.ErrChecksum, "%s, bit %d", reader, i)
					} else {
						require.True(t, errors.Is(err, block.ErrCorrupt) || errors.Is(err, block.ErrVersion), "%s, bit %d: %v", reader, i, err)
					}
				}
				require.Zero(t, calls, "values were handed out of the block with bit %d flipped", i)
			}
		})
	}
}

// mixedReadings are n readings of ints, bools, strings and decimal
// floats, some without every name.
func mixedReadings(n int) []buckets.Reading {
	rs := make([]buckets.Reading, n)
	for i := range rs {
		vs := []buckets.Field{
			{Name: "count", Value: buckets.Int(int64(i * 3))},
			{Name: "ok", Value: buckets.Bool(i%7 != 0)},
			{Name: "status", Value: buckets.String([]string{"idle", "run", "stop"}[i%3])},
			{Name: "temp", Value: buckets.Float(float64(2150+i%13) / 100)},
		}
		if i%5 == 1 {
			vs = vs[:2]
		}
		rs[i] = buckets.Reading{Device: "dev-1", Ticks: start + buckets.Ticks(i)*10*buckets.TicksPerSecond, Values: vs}
	}
	return rs
}

// TestZstdChecksumNotCheckedBehindTheBlockChecksum damages the content
// checksum at the end of the zstd frame of a block: the block's CRC-32C
// (resealed here) already vouches for the frame's bytes, so zstd's own
// checksum is not computed again.
func TestZstdChecksumNotCheckedBehindTheBlockChecksum(t *testing.T) {
	sealed, err := block.Encode(nil, mixedReadings(300))
	require.NoError(t, err)
	damaged := bytes.Clone(sealed)
	damaged[len(damaged)-5] ^= 0x01 // before the block's CRC-32C: the frame's content checksum
	damaged = block.Reseal(damaged)
	_, rs, err := block.Decode(damaged, "dev-1")
	require.NoError(t, err)
	assert.Equal(t, mixedReadings(300), rs)
}
