package block_test

import (
	"bytes"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
)

// windowOf is what Scanner.Readings must return: the readings of rs
// (Decode's) with lo <= ticks < hi, cut to the newest or oldest limit.
func windowOf(rs []buckets.Reading, lo, hi buckets.Ticks, limit int, newest bool) []buckets.Reading {
	out := []buckets.Reading{}
	for _, r := range rs {
		if r.Ticks >= lo && r.Ticks < hi {
			out = append(out, r)
		}
	}
	if limit > 0 && len(out) > limit {
		if newest {
			out = out[len(out)-limit:]
		} else {
			out = out[:limit]
		}
	}
	return out
}

// checkWindows requires Readings to equal Decode's rows for windows
// with every edge on, just after or just before a reading (every pair
// when the block is small, a sample otherwise), without and with
// limits. Values compare by their bits, so -0 and NaN compare exactly.
func checkWindows(t *testing.T, sc *block.Scanner, b []byte, rs []buckets.Reading) {
	t.Helper()
	edges := []buckets.Ticks{0, buckets.MaxTicks + 1}
	step := max(1, len(rs)/12)
	for i := 0; i < len(rs); i += step {
		k := rs[i].Ticks
		edges = append(edges, k, k+1, max(k, 1)-1)
	}
	k := rs[len(rs)-1].Ticks
	edges = append(edges, k, k+1)
	for _, lo := range edges {
		for _, hi := range edges {
			for _, limit := range []int{0, 1, 3} {
				for _, newest := range []bool{true, false} {
					got, err := sc.Readings(b, "dev-1", lo, hi, limit, newest)
					require.NoError(t, err)
					require.Equal(t, windowOf(rs, lo, hi, limit, newest), got, "window [%d, %d) limit %d newest %v", lo, hi, limit, newest)
					for _, r := range got {
						require.Equal(t, len(r.Values), cap(r.Values), "values of a reading end where they end, as Decode's")
					}
				}
			}
		}
	}
}

func TestReadingsEqualDecodeForEveryWindow(t *testing.T) {
	mixed := []buckets.Reading{
		{Device: "dev-1", Ticks: start, Values: []buckets.Field{{Name: "a", Value: buckets.Float(1.5)}}},
		{Device: "dev-1", Ticks: start + 7, Values: []buckets.Field{{Name: "a", Value: buckets.Int(-3)}, {Name: "b", Value: buckets.String("x")}}},
		{Device: "dev-1", Ticks: start + 8, Values: []buckets.Field{{Name: "b", Value: buckets.Bool(true)}}},
		{Device: "dev-1", Ticks: start + 9, Values: []buckets.Field{{Name: "c", Value: buckets.String("")}, {Name: "d", Value: buckets.Float(math.NaN())}}},
		{Device: "dev-1", Ticks: start + 1000, Values: []buckets.Field{{Name: "a", Value: buckets.Float(math.Pi)}, {Name: "b", Value: buckets.String("")}}},
		{Device: "dev-1", Ticks: start + 1001, Values: []buckets.Field{{Name: "a", Value: buckets.Float(math.Copysign(0, -1))}, {Name: "b", Value: buckets.String("x")}}},
		{Device: "dev-1", Ticks: start + 1003, Values: []buckets.Field{{Name: "d", Value: buckets.Float(math.Float64frombits(0x7ff8000000000001))}}},
	}
	var sc block.Scanner // reused across blocks, as the store reuses it
	for name, rs := range map[string][]buckets.Reading{"one": series(1, 1), "steady": series(3600, 2), "mixed": mixed} {
		t.Run(name, func(t *testing.T) {
			b, err := block.Encode(nil, rs)
			require.NoError(t, err)
			_, want, err := block.Decode(b, "dev-1")
			require.NoError(t, err)
			checkWindows(t, &sc, b, want)
		})
	}
}

func TestReadingsRejectWhatDecodeRejects(t *testing.T) {
	b, err := block.Encode(nil, series(300, 5))
	require.NoError(t, err)
	var sc block.Scanner
	for n := 0; n < len(b); n += max(1, len(b)/97) {
		_, err := sc.Readings(b[:n], "dev-1", 0, buckets.MaxTicks+1, 1, true)
		require.Error(t, err, "truncated at %d", n)
	}
	other := bytes.Clone(b)
	other[0] = block.Version + 1
	_, err = sc.Readings(other, "dev-1", 0, buckets.MaxTicks+1, 0, true)
	require.ErrorIs(t, err, block.ErrVersion)
}

func TestReadingsOwnTheirStrings(t *testing.T) {
	// Too small to compress: the columns are the block's bytes.
	b, err := block.Encode(nil, series(3, 1))
	require.NoError(t, err)
	var sc block.Scanner
	got, err := sc.Readings(b, "dev-1", 0, buckets.MaxTicks+1, 0, true)
	require.NoError(t, err)
	clear(b)
	require.Equal(t, series(3, 1), got, "readings unchanged after the block's bytes are gone")
}

func TestReadingsAllocateOnlyForTheWindow(t *testing.T) {
	rs := secondsReadings()
	b, err := block.Encode(nil, rs)
	require.NoError(t, err)
	var sc block.Scanner
	read := func() {
		got, err := sc.Readings(b, "dev-1", 0, buckets.MaxTicks+1, 10, true)
		require.NoError(t, err)
		require.Len(t, got, 10)
	}
	read()
	// The readings, their values, the three name strings and little
	// else: a handful, not one per row of the block's 3,600 (Decode
	// makes a value slice per column and strings per dictionary); the
	// columns go into the scanner's reused buffers.
	require.LessOrEqual(t, testing.AllocsPerRun(20, read), 6.0)
}

// ReadingsIn places the values in the caller's array while it has
// room, block after block, each reading's values ending where they
// end; without room they go to a new array, and the readings are
// always Readings'.
func TestReadingsInUsesTheCallersArray(t *testing.T) {
	var sc block.Scanner
	b1, err := block.Encode(nil, series(50, 1))
	require.NoError(t, err)
	b2, err := block.Encode(nil, series(30, 2))
	require.NoError(t, err)
	want1, err := sc.Readings(b1, "dev-1", 0, buckets.MaxTicks+1, 0, false)
	require.NoError(t, err)
	want2, err := sc.Readings(b2, "dev-1", 0, buckets.MaxTicks+1, 0, false)
	require.NoError(t, err)

	arena := make([]buckets.Field, 3, 4*(50+30)+3) // series has 4 values a reading
	got1, vals, err := sc.ReadingsIn(arena, b1, "dev-1", 0, buckets.MaxTicks+1, 0, false)
	require.NoError(t, err)
	got2, vals, err := sc.ReadingsIn(vals, b2, "dev-1", 0, buckets.MaxTicks+1, 0, false)
	require.NoError(t, err)
	require.Equal(t, want1, got1)
	require.Equal(t, want2, got2)
	require.Len(t, vals, 3+4*80)
	require.Same(t, &arena[:4][3], &got1[0].Values[0], "the first values follow what the array held")
	require.Same(t, &arena[:3+4*50+1][3+4*50], &got2[0].Values[0], "the next block's follow the first's")
	for _, r := range got1 {
		require.Equal(t, len(r.Values), cap(r.Values))
	}

	small := make([]buckets.Field, 0, 10)
	got3, vals, err := sc.ReadingsIn(small, b1, "dev-1", 0, buckets.MaxTicks+1, 0, false)
	require.NoError(t, err)
	require.Equal(t, want1, got3)
	require.Len(t, vals, 4*50)
	require.Equal(t, 4*50, cap(vals), "a new array, as Readings makes")
	require.Zero(t, small[:10][0].Name, "the short array is left alone")
}

// BenchmarkReadingsLatest10OneHour and BenchmarkDecodeLatest10OneHour
// read the newest 10 readings of a sealed one-hour block at 1 s
// (3,600 readings of three values), the read behind latest-10.
func BenchmarkReadingsLatest10OneHour(b *testing.B) {
	blk := secondsBlock(b)
	var sc block.Scanner
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sc.Readings(blk, "dev-1", 0, buckets.MaxTicks+1, 10, true); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeLatest10OneHour(b *testing.B) {
	blk := secondsBlock(b)
	b.ReportAllocs()
	for b.Loop() {
		_, rs, err := block.Decode(blk, "dev-1")
		if err != nil {
			b.Fatal(err)
		}
		_ = rs[len(rs)-10:]
	}
}

// secondsReadings is an hour of one reading per second with three
// two-decimal values.
func secondsReadings() []buckets.Reading {
	rs := make([]buckets.Reading, 3600)
	for i := range rs {
		rs[i] = buckets.Reading{Ticks: start + buckets.Ticks(i)*buckets.TicksPerSecond, Values: []buckets.Field{
			{Name: "battery", Value: buckets.Float(float64(9000-i/60) / 100)},
			{Name: "humidity", Value: buckets.Float(float64(4000+i%97) / 100)},
			{Name: "temp", Value: buckets.Float(float64(2100+i%61) / 100)},
		}}
	}
	return rs
}

func secondsBlock(b *testing.B) []byte {
	rs := secondsReadings()
	blk, err := block.Encode(nil, rs)
	require.NoError(b, err)
	return blk
}
