package block_test

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
)

// numericColumn is one name's numeric values with their ticks.
type numericColumn struct {
	ticks []buckets.Ticks
	vals  []uint64 // float64 bits, so -0 and NaN compare exactly
}

// numericOf is what Scanner.Numeric must report for rs: per name, the
// numeric values of the readings that carry it, oldest first.
func numericOf(rs []buckets.Reading, want func(string) bool) map[string]*numericColumn {
	out := map[string]*numericColumn{}
	for _, r := range rs {
		for _, f := range r.Values {
			x, ok := buckets.Numeric(f.Value)
			if !ok || !want(f.Name) {
				continue
			}
			if out[f.Name] == nil {
				out[f.Name] = &numericColumn{}
			}
			c := out[f.Name]
			c.ticks, c.vals = append(c.ticks, r.Ticks), append(c.vals, math.Float64bits(x))
		}
	}
	return out
}

// scanned runs sc over b and collects what it reports, checking that
// names come in order.
func scanned(t *testing.T, sc *block.Scanner, b []byte, want func(string) bool) (map[string]*numericColumn, error) {
	t.Helper()
	out := map[string]*numericColumn{}
	last := ""
	err := sc.Numeric(b, func(name []byte) bool { return want(string(name)) }, func(name []byte, ticks []buckets.Ticks, vals []float64) {
		require.Greater(t, string(name), last, "names in order, each once")
		last = string(name)
		require.Len(t, vals, len(ticks))
		c := &numericColumn{ticks: append([]buckets.Ticks(nil), ticks...)}
		for _, x := range vals {
			c.vals = append(c.vals, math.Float64bits(x))
		}
		out[string(name)] = c
	})
	return out, err
}

func TestScannerReportsTheNumericValuesDecodeReturns(t *testing.T) {
	mixed := []buckets.Reading{
		{Ticks: start, Values: []buckets.Field{{Name: "a", Value: buckets.Float(1.5)}}},
		{Ticks: start + 7, Values: []buckets.Field{{Name: "a", Value: buckets.Int(-3)}, {Name: "b", Value: buckets.String("x")}}},
		{Ticks: start + 8, Values: []buckets.Field{{Name: "b", Value: buckets.Bool(true)}, {Name: "c", Value: buckets.String("only strings")}}},
		{Ticks: start + 9, Values: []buckets.Field{{Name: "b", Value: buckets.Bool(false)}}},
		{Ticks: start + 1000, Values: []buckets.Field{{Name: "a", Value: buckets.Float(math.Copysign(0, -1))}, {Name: "b", Value: buckets.String("")}}},
		{Ticks: start + 1001, Values: []buckets.Field{{Name: "a", Value: buckets.Float(math.NaN())}, {Name: "b", Value: buckets.Int(math.MaxInt64)}}},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var sparse []buckets.Reading // random presence, kinds and float encodings, zstd-compressed
	for i := range 3000 {
		var fs []buckets.Field
		for _, name := range []string{"p", "q", "r"} {
			switch rng.IntN(6) {
			case 0:
				fs = append(fs, buckets.Field{Name: name, Value: buckets.Float(float64(rng.IntN(1000)) / 100)})
			case 1:
				fs = append(fs, buckets.Field{Name: name, Value: buckets.Float(rng.NormFloat64())})
			case 2:
				fs = append(fs, buckets.Field{Name: name, Value: buckets.Int(rng.Int64N(1<<40) - 1<<39)})
			case 3:
				fs = append(fs, buckets.Field{Name: name, Value: buckets.Bool(rng.IntN(2) == 0)})
			case 4:
				fs = append(fs, buckets.Field{Name: name, Value: buckets.String([]string{"a", "b", "c"}[rng.IntN(3)])})
			}
		}
		if len(fs) == 0 {
			fs = append(fs, buckets.Field{Name: "q", Value: buckets.Int(int64(i))})
		}
		sparse = append(sparse, buckets.Reading{Ticks: start + buckets.Ticks(i)*buckets.Ticks(1+rng.IntN(50000)), Values: fs})
	}
	for i := 1; i < len(sparse); i++ { // ticks strictly increasing
		sparse[i].Ticks = max(sparse[i].Ticks, sparse[i-1].Ticks+1)
	}
	all := func(string) bool { return true }
	var sc block.Scanner // one scanner for every case: its buffers are reused
	for name, rs := range map[string][]buckets.Reading{
		"one reading": series(1, 1), "steady": series(2000, 2), "mixed kinds": mixed, "sparse": sparse,
	} {
		t.Run(name, func(t *testing.T) {
			b, err := block.Encode(nil, rs)
			require.NoError(t, err)
			got, err := scanned(t, &sc, b, all)
			require.NoError(t, err)
			assert.Equal(t, numericOf(rs, all), got)
			only := func(n string) bool { return n == "a" || n == "count" || n == "q" }
			got, err = scanned(t, &sc, b, only)
			require.NoError(t, err)
			assert.Equal(t, numericOf(rs, only), got, "only the wanted names")
		})
	}
}

// TestScannerSkipsColumnsNotWanted reads random blocks (values present
// or not, every kind, decimal and XOR floats, ints of every width,
// strings with one or many distinct values) asking for random subsets
// of their names: the columns in between are skipped, and the wanted
// ones must still be exactly Decode's values.
func TestScannerSkipsColumnsNotWanted(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	names := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	var sc block.Scanner
	for round := range 60 {
		n := 1 + rng.IntN(3000)
		if round%3 == 0 {
			n = 1 + rng.IntN(20)
		}
		// Per name a character: how often it is present and which kinds
		// it takes.
		type style struct {
			presence float64
			kinds    []int
		}
		styles := make([]style, len(names))
		for i := range styles {
			styles[i] = style{presence: []float64{1, 1, 0.5, 0.05}[rng.IntN(4)]}
			for range 1 + rng.IntN(2) {
				styles[i].kinds = append(styles[i].kinds, rng.IntN(6))
			}
		}
		rs := make([]buckets.Reading, n)
		k := start
		for i := range rs {
			k += buckets.Ticks(1 + rng.IntN(100000))
			var fs []buckets.Field
			for j, name := range names {
				if rng.Float64() >= styles[j].presence {
					continue
				}
				var v buckets.Value
				switch styles[j].kinds[rng.IntN(len(styles[j].kinds))] {
				case 0:
					v = buckets.Float(float64(rng.IntN(100000)-50000) / 100)
				case 1:
					v = buckets.Float(rng.NormFloat64() * 1e6)
				case 2:
					v = buckets.Int(rng.Int64N(1<<20) - 1<<19)
				case 3:
					v = buckets.Int(rng.Int64() - 1<<62)
				case 4:
					v = buckets.Bool(rng.IntN(2) == 0)
				default:
					v = buckets.String([]string{"x", "yy", "a longer string"}[rng.IntN(1+round%3)])
				}
				fs = append(fs, buckets.Field{Name: name, Value: v})
			}
			if len(fs) == 0 {
				fs = []buckets.Field{{Name: "e", Value: buckets.Int(int64(i))}}
			}
			rs[i] = buckets.Reading{Ticks: k, Values: fs}
		}
		b, err := block.Encode(nil, rs)
		require.NoError(t, err)
		require.True(t, block.Checksummed(b))
		for range 4 {
			wanted := map[string]bool{}
			for _, name := range names {
				wanted[name] = rng.IntN(3) == 0
			}
			want := func(n string) bool { return wanted[n] }
			got, err := scanned(t, &sc, b, want)
			require.NoError(t, err, "round %d", round)
			require.Equal(t, numericOf(rs, want), got, "round %d, wanted %v", round, wanted)
		}
	}
}

func TestScannerNeverWritesIntoTheBlock(t *testing.T) {
	// Too small to compress: its columns are the block's bytes, with
	// room behind them that a decoder reusing them would write into.
	small, err := block.Encode(make([]byte, 0, 1<<20), series(2, 1))
	require.NoError(t, err)
	big, err := block.Encode(nil, series(2000, 2))
	require.NoError(t, err)
	keep := bytes.Clone(small)
	var sc block.Scanner
	all := func([]byte) bool { return true }
	require.NoError(t, sc.Numeric(small, all, func([]byte, []buckets.Ticks, []float64) {}))
	require.NoError(t, sc.Numeric(big, all, func([]byte, []buckets.Ticks, []float64) {}))
	assert.Equal(t, keep, small)
	assert.Equal(t, make([]byte, 1<<10), small[len(small):len(small)+1<<10], "nor behind it")
}

func TestScannerRejectsWhatDecodeRejects(t *testing.T) {
	b, err := block.Encode(nil, series(300, 5))
	require.NoError(t, err)
	var sc block.Scanner
	all := func([]byte) bool { return true }
	for n := 0; n < len(b); n += max(1, len(b)/97) {
		require.Error(t, sc.Numeric(b[:n], all, func([]byte, []buckets.Ticks, []float64) {}), "truncated at %d", n)
	}
	other := bytes.Clone(b)
	other[0] = block.Version + 1
	require.ErrorIs(t, sc.Numeric(other, all, func([]byte, []buckets.Ticks, []float64) {}), block.ErrVersion)
}

// BenchmarkScanOneHour and BenchmarkDecodeOneHour read the same
// one-hour block of one value at 10 s (the blocks a fleet's 5-minute
// charts cut).
func BenchmarkScanOneHour(b *testing.B) {
	blk := oneHourBlock(b)
	var sc block.Scanner
	var sum float64
	b.ReportAllocs()
	for b.Loop() {
		err := sc.Numeric(blk, func([]byte) bool { return true }, func(_ []byte, _ []buckets.Ticks, vals []float64) {
			for _, x := range vals {
				sum += x
			}
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeOneHour(b *testing.B) {
	blk := oneHourBlock(b)
	var sum float64
	b.ReportAllocs()
	for b.Loop() {
		_, rs, err := block.Decode(blk, "dev-1")
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range rs {
			sum += r.Values[0].Value.AsFloat()
		}
	}
}

func oneHourBlock(b *testing.B) []byte {
	rs := make([]buckets.Reading, 360)
	for i := range rs {
		rs[i] = buckets.Reading{Ticks: start + buckets.Ticks(i)*10*buckets.TicksPerSecond,
			Values: []buckets.Field{{Name: "temp", Value: buckets.Float(float64(i%60) / 6)}}}
	}
	blk, err := block.Encode(nil, rs)
	require.NoError(b, err)
	return blk
}
