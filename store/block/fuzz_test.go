package block_test

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
)

func mustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// FuzzDecode feeds arbitrary bytes to the decoder, as they are and
// with their checksum made to match (block.Reseal), so that the fuzzer
// reaches the decoder behind the checksum too. The decoder must never
// panic; a block of the checksummed version whose checksum does not
// match is refused by every reader; whatever is accepted must encode
// again into a block that decodes to the same readings. The Scanner
// must accept exactly what Decode accepts and report the same numeric
// values, and Scanner.Readings must return Decode's rows for every
// window. The seed corpus is in testdata/fuzz/FuzzDecode (checksummed
// blocks, and bodies the fuzzer reseals).
func FuzzDecode(f *testing.F) {
	for _, rs := range [][]buckets.Reading{series(1, 1), series(50, 2), {
		{Ticks: 5, Values: []buckets.Field{{Name: "a", Value: buckets.Float(math.Pi)}, {Name: "b", Value: buckets.String("x")}}},
		{Ticks: 9, Values: []buckets.Field{{Name: "a", Value: buckets.Int(-1)}}},
	}} {
		b, err := block.Encode(nil, rs)
		require.NoError(f, err)
		f.Add(b)
	}
	var sc block.Scanner // reused across inputs, as the store reuses it across blocks
	f.Fuzz(func(t *testing.T, data []byte) {
		sealed := block.Reseal(data)
		if block.Checksummed(data) && !bytes.Equal(sealed, data) {
			_, _, err := block.Decode(data, "dev-1")
			require.ErrorIs(t, err, block.ErrChecksum)
			_, _, err = block.EachSummary(data, func([]byte, buckets.Summary) { t.Fatal("a summary of a block whose checksum does not match") })
			require.ErrorIs(t, err, block.ErrChecksum)
		}
		checkDecoders(t, &sc, data)
		checkDecoders(t, &sc, sealed)
	})
}

// checkDecoders checks that the readers of the package agree on data.
func checkDecoders(t *testing.T, sc *block.Scanner, data []byte) {
	all := func(string) bool { return true }
	h, rs, err := block.Decode(data, "dev-1")
	got, scanErr := scanned(t, sc, data, all)
	_, winErr := sc.Readings(data, "dev-1", 0, buckets.MaxTicks+1, 1, true)
	if err != nil {
		require.Error(t, scanErr, "the scanner refuses what Decode refuses (%v)", err)
		require.Error(t, winErr, "Readings refuses what Decode refuses (%v)", err)
		return
	}
	require.NoError(t, scanErr, "the scanner accepts what Decode accepts")
	require.NoError(t, winErr, "Readings accepts what Decode accepts")
	checkWindows(t, sc, data, rs)
	require.Equal(t, numericOf(rs, all), got)
	// Asking for some names skips the other columns, with the same values.
	some := func(n string) bool { return len(n)%2 == 0 }
	gotSome, err := scanned(t, sc, data, some)
	require.NoError(t, err, "the scanner accepts, for some names, what Decode accepts")
	require.Equal(t, numericOf(rs, some), gotSome)
	require.Len(t, rs, h.Count)
	again, err := block.Encode(nil, rs)
	require.NoError(t, err, "a decoded block encodes again")
	h2, rs2, err := block.Decode(again, "dev-1")
	require.NoError(t, err)
	require.Equal(t, h.Count, h2.Count)
	require.Equal(t, len(rs), len(rs2))
	for i := range rs {
		require.Equal(t, rs[i].Ticks, rs2[i].Ticks)
		require.Equal(t, len(rs[i].Values), len(rs2[i].Values))
		for j := range rs[i].Values {
			a, b := rs[i].Values[j], rs2[i].Values[j]
			require.Equal(t, a.Name, b.Name)
			require.Equal(t, a.Value.Kind, b.Value.Kind)
			if a.Value.Kind == buckets.KindFloat {
				require.Equal(t, math.Float64bits(a.Value.AsFloat()), math.Float64bits(b.Value.AsFloat()))
			} else {
				require.Equal(t, a.Value, b.Value)
			}
		}
	}
}
