package block_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
)

// start is 2026-11-22T00:00:00Z in ticks.
var start = buckets.MustTicks(mustTime("2026-11-22T00:00:00Z"))

// series makes n readings 10 s apart with a decimal temperature, an
// integer counter, a flag and a status string.
func series(n int, seed uint64) []buckets.Reading {
	rng := rand.New(rand.NewPCG(seed, 1))
	rs := make([]buckets.Reading, n)
	temp := 21.5
	for i := range rs {
		temp += float64(rng.IntN(21)-10) / 100
		temp = math.Round(temp*100) / 100
		rs[i] = buckets.Reading{Device: "dev-1", Ticks: start + buckets.Ticks(i)*10*buckets.TicksPerSecond, Values: []buckets.Field{
			{Name: "count", Value: buckets.Int(int64(i * 3))},
			{Name: "ok", Value: buckets.Bool(i%7 != 0)},
			{Name: "status", Value: buckets.String([]string{"idle", "run", "stop"}[i%3])},
			{Name: "temp", Value: buckets.Float(temp)},
		}}
	}
	return rs
}

func TestRoundTripKeepsEveryReading(t *testing.T) {
	cases := map[string][]buckets.Reading{
		"one reading": series(1, 1),
		"steady":      series(2000, 2),
		"sparse names and mixed kinds": {
			{Device: "dev-1", Ticks: start, Values: []buckets.Field{{Name: "a", Value: buckets.Float(1.5)}}},
			{Device: "dev-1", Ticks: start + 7, Values: []buckets.Field{{Name: "a", Value: buckets.Int(-3)}, {Name: "b", Value: buckets.String("x")}}},
			{Device: "dev-1", Ticks: start + 8, Values: []buckets.Field{{Name: "b", Value: buckets.Bool(true)}}},
			{Device: "dev-1", Ticks: start + 1000, Values: []buckets.Field{{Name: "a", Value: buckets.Float(math.Pi)}, {Name: "b", Value: buckets.String("")}}},
		},
		"names changing place from reading to reading": {
			{Device: "dev-1", Ticks: start, Values: []buckets.Field{{Name: "a", Value: buckets.Int(1)}, {Name: "b", Value: buckets.Int(2)}, {Name: "c", Value: buckets.Int(3)}}},
			{Device: "dev-1", Ticks: start + 1, Values: []buckets.Field{{Name: "b", Value: buckets.Int(4)}, {Name: "c", Value: buckets.Int(5)}}},
			{Device: "dev-1", Ticks: start + 2, Values: []buckets.Field{{Name: "a", Value: buckets.Int(6)}, {Name: "c", Value: buckets.Int(7)}}},
			{Device: "dev-1", Ticks: start + 3, Values: []buckets.Field{{Name: "c", Value: buckets.Int(8)}}},
			{Device: "dev-1", Ticks: start + 4, Values: []buckets.Field{{Name: "a", Value: buckets.Int(9)}, {Name: "b", Value: buckets.Int(10)}, {Name: "c", Value: buckets.Int(11)}, {Name: "d", Value: buckets.Int(12)}}},
		},
		"float edges": {
			{Device: "dev-1", Ticks: start, Values: []buckets.Field{{Name: "f", Value: buckets.Float(math.Copysign(0, -1))}}},
			{Device: "dev-1", Ticks: start + 1, Values: []buckets.Field{{Name: "f", Value: buckets.Float(math.MaxFloat64)}}},
			{Device: "dev-1", Ticks: start + 2, Values: []buckets.Field{{Name: "f", Value: buckets.Float(math.SmallestNonzeroFloat64)}}},
			{Device: "dev-1", Ticks: start + 3, Values: []buckets.Field{{Name: "f", Value: buckets.Float(0.1)}}},
			{Device: "dev-1", Ticks: start + 4, Values: []buckets.Field{{Name: "f", Value: buckets.Float(1 << 60)}}},
		},
		"negative zero alone": {
			{Device: "dev-1", Ticks: start, Values: []buckets.Field{{Name: "f", Value: buckets.Float(math.Copysign(0, -1))}}},
			{Device: "dev-1", Ticks: start + 1, Values: []buckets.Field{{Name: "f", Value: buckets.Float(0)}}},
		},
		"int edges": {
			{Device: "dev-1", Ticks: 0, Values: []buckets.Field{{Name: "i", Value: buckets.Int(math.MinInt64)}}},
			{Device: "dev-1", Ticks: 1, Values: []buckets.Field{{Name: "i", Value: buckets.Int(math.MaxInt64)}}},
			{Device: "dev-1", Ticks: buckets.MaxTicks, Values: []buckets.Field{{Name: "i", Value: buckets.Int(0)}}},
		},
	}
	encoders := map[string]func([]byte, []buckets.Reading) ([]byte, error){
		"zstd": block.Encode, "plain": block.EncodePlain,
	}
	for name, rs := range cases {
		for enc, encode := range encoders {
			t.Run(name+"/"+enc, func(t *testing.T) { roundTrip(t, encode, rs) })
		}
	}
	// The plain encoding leaves the columns as they are: a steady
	// series takes several times its zstd size.
	steady := cases["steady"]
	packed, err := block.Encode(nil, steady)
	require.NoError(t, err)
	plain, err := block.EncodePlain(nil, steady)
	require.NoError(t, err)
	assert.Greater(t, len(plain), 2*len(packed), "plain %d bytes, zstd %d", len(plain), len(packed))
}

// roundTrip checks that the block encode makes of rs decodes to rs.
func roundTrip(t *testing.T, encode func([]byte, []buckets.Reading) ([]byte, error), rs []buckets.Reading) {
	t.Helper()
	b, err := encode(nil, rs)
	require.NoError(t, err)
	h, got, err := block.Decode(b, "dev-1")
	require.NoError(t, err)
	require.Equal(t, len(rs), h.Count)
	assert.Equal(t, rs[0].Ticks, h.Oldest)
	assert.Equal(t, rs[len(rs)-1].Ticks, h.Newest)
	require.Len(t, got, len(rs))
	for i := range rs {
		require.Equal(t, rs[i].Ticks, got[i].Ticks, "reading %d", i)
		require.Equal(t, len(rs[i].Values), len(got[i].Values), "reading %d", i)
		for j, f := range rs[i].Values {
			g := got[i].Values[j]
			require.Equal(t, f.Name, g.Name)
			require.Equal(t, f.Value.Kind, g.Value.Kind)
			if f.Value.Kind == buckets.KindFloat {
				require.Equal(t, math.Float64bits(f.Value.AsFloat()), math.Float64bits(g.Value.AsFloat()), "reading %d %s", i, f.Name)
			} else {
				require.Equal(t, f.Value, g.Value, "reading %d %s", i, f.Name)
			}
		}
	}
}

func TestHeaderSummariesMatchTheReadings(t *testing.T) {
	rs := series(500, 3)
	b, err := block.Encode(nil, rs)
	require.NoError(t, err)
	h, err := block.ReadHeader(b)
	require.NoError(t, err)
	want := map[string]*buckets.Summary{}
	counts := map[string]int{}
	for _, r := range rs {
		for _, f := range r.Values {
			counts[f.Name]++
			if x, ok := buckets.Numeric(f.Value); ok {
				if want[f.Name] == nil {
					want[f.Name] = &buckets.Summary{}
				}
				want[f.Name].Add(r.Ticks, x)
			}
		}
	}
	require.Len(t, h.Names, 4)
	for _, in := range h.Names {
		assert.Equal(t, counts[in.Name], in.Count, in.Name)
		if in.Name == "status" {
			assert.Zero(t, in.Num.Count, "strings are not summarised")
			assert.Equal(t, uint8(1<<buckets.KindString), in.Kinds)
			continue
		}
		w, got := *want[in.Name], in.Num
		assert.InDelta(t, w.Sum, got.Sum, 1e-9*math.Abs(w.Sum), "%s: the header holds the exact decimal sum", in.Name)
		w.Sum, got.Sum = 0, 0
		assert.Equal(t, w, got, in.Name)
	}
}

func TestSteadySeriesCompressesToAFewBytesPerReading(t *testing.T) {
	rs := series(2048, 4)
	b, err := block.Encode(nil, rs)
	require.NoError(t, err)
	perReading := float64(len(b)) / float64(len(rs))
	t.Logf("%d readings of 4 values: %d bytes, %.2f B/reading", len(rs), len(b), perReading)
	assert.Less(t, perReading, 3.0)
}

func TestEncodeRejectsWhatABlockCannotHold(t *testing.T) {
	one := []buckets.Field{{Name: "a", Value: buckets.Int(1)}}
	cases := map[string][]buckets.Reading{
		"empty":          nil,
		"unsorted":       {{Ticks: 2, Values: one}, {Ticks: 1, Values: one}},
		"same ticks":     {{Ticks: 2, Values: one}, {Ticks: 2, Values: one}},
		"no values":      {{Ticks: 2}},
		"duplicate name": {{Ticks: 2, Values: append(one, one...)}},
		"too many":       make([]buckets.Reading, block.MaxReadings+1),
	}
	for name, rs := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := block.Encode(nil, rs)
			require.Error(t, err)
		})
	}
}

func TestDecodeRejectsDamage(t *testing.T) {
	b, err := block.Encode(nil, series(300, 5))
	require.NoError(t, err)
	for n := 0; n < len(b); n += max(1, len(b)/97) {
		_, _, err := block.Decode(b[:n], "dev-1")
		require.Error(t, err, "truncated at %d", n)
	}
	flipped := bytes.Clone(b)
	flipped[len(flipped)-3] ^= 0xff
	_, _, err = block.Decode(flipped, "dev-1")
	require.Error(t, err)

	other := bytes.Clone(b)
	other[0] = block.Version + 1
	_, _, err = block.Decode(other, "dev-1")
	require.ErrorIs(t, err, block.ErrVersion)
	assert.Contains(t, err.Error(), fmt.Sprint(block.Version+1))
	assert.False(t, errors.Is(err, block.ErrCorrupt))
}

func TestEachSummaryAgreesWithReadHeader(t *testing.T) {
	b, err := block.Encode(nil, series(300, 9))
	require.NoError(t, err)
	h, err := block.ReadHeader(b)
	require.NoError(t, err)
	var got []block.NameInfo
	oldest, newest, err := block.EachSummary(b, func(name []byte, s buckets.Summary) {
		got = append(got, block.NameInfo{Name: string(name), Num: s})
	})
	require.NoError(t, err)
	assert.Equal(t, h.Oldest, oldest)
	assert.Equal(t, h.Newest, newest)
	var want []block.NameInfo
	for _, in := range h.Names {
		if in.Num.Count > 0 {
			want = append(want, block.NameInfo{Name: in.Name, Num: in.Num})
		}
	}
	assert.Equal(t, want, got)
	for n := 0; n < len(b)/4; n++ {
		_, _, err := block.EachSummary(b[:n], func([]byte, buckets.Summary) {})
		require.Error(t, err, "truncated at %d", n)
	}
}
