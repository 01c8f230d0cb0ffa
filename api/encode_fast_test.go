package api

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// The hand-written time and number appenders must write exactly the
// bytes of the standard library's formatting they replace.

// wantTicksTime is the reference: the quoted RFC3339Nano text of k.
func wantTicksTime(k buckets.Ticks) string {
	return `"` + k.Time().Format(time.RFC3339Nano) + `"`
}

func TestAppendTicksTime(t *testing.T) {
	day := func(y int, m time.Month, d int) buckets.Ticks {
		return buckets.MustTicks(time.Date(y, m, d, 0, 0, 0, 0, time.UTC))
	}
	cases := []buckets.Ticks{0, 1, 10, buckets.TicksPerSecond - 1, buckets.TicksPerDay - 1, buckets.MaxTicks,
		buckets.MaxTicks - buckets.TicksPerDay, 1_234_500, 1_000_000, 1_200_000, 5_000_000, 9_999_990}
	// Leap years and the days around them, by the century rules.
	for _, y := range []int{1, 4, 99, 100, 400, 1600, 1700, 1899, 1900, 1969, 1970, 2000, 2024, 2026, 2100, 9999} {
		for _, md := range [][2]int{{1, 1}, {2, 28}, {2, 29}, {3, 1}, {12, 31}} {
			k := day(y, time.Month(md[0]), md[1])
			cases = append(cases, k, k+buckets.TicksPerDay-1, k+12*3600*buckets.TicksPerSecond+7)
		}
	}
	// Every day of four centuries (a whole era of the calendar).
	for k := day(1999, 1, 1); k < day(2401, 1, 1); k += buckets.TicksPerDay {
		cases = append(cases, k)
	}
	rnd := rand.New(rand.NewPCG(21, 22))
	for range 100_000 {
		k := buckets.Ticks(rnd.Int64N(int64(buckets.MaxTicks) + 1))
		if rnd.IntN(4) == 0 {
			k -= k % buckets.Ticks([]int64{10, 1000, 100_000, buckets.TicksPerSecond}[rnd.IntN(4)])
		}
		cases = append(cases, k)
	}
	for _, k := range cases {
		if got := string(appendTicksTime(nil, k)); got != wantTicksTime(k) {
			t.Fatalf("ticks %d: got %s, want %s", k, got, wantTicksTime(k))
		}
	}
}

func FuzzAppendTicksTime(f *testing.F) {
	for _, k := range []int64{0, 1, int64(buckets.MaxTicks), 638_987_654_321_234_500} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, k int64) {
		if !buckets.Ticks(k).Valid() {
			t.Skip()
		}
		require.Equal(t, wantTicksTime(buckets.Ticks(k)), string(appendTicksTime([]byte("x"), buckets.Ticks(k))[1:]))
	})
}

func TestAppendDate(t *testing.T) {
	for d := buckets.DayOf(0); d <= buckets.DayOf(buckets.MaxTicks); d += 1 + buckets.Day(d%7) {
		if got, want := string(appendDate(nil, d)), d.String(); got != want {
			t.Fatalf("day %d: got %s, want %s", d, got, want)
		}
	}
}

// wantFloat is the reference: what encoding/json writes for f.
func wantFloat(t testing.TB, f float64) string {
	b, err := json.Marshal(f)
	require.NoError(t, err)
	return string(b)
}

// TestAppendFloatCentis checks the two-decimal fast path where it is
// taken and at its edges: multiples of 0.01 up to the bound, their
// neighbouring floats (which must not be taken for decimals), and
// integers.
func TestAppendFloatCentis(t *testing.T) {
	var cases []float64
	for m := int64(-20_000); m <= 20_000; m++ {
		cases = append(cases, float64(m)/100)
	}
	rnd := rand.New(rand.NewPCG(23, 24))
	for range 200_000 {
		scale := []int64{100, 10_000, 1_000_000, 100_000_000, int64(maxCentis) * 100}[rnd.IntN(5)]
		m := rnd.Int64N(2*scale) - scale
		f := float64(m) / 100
		cases = append(cases, f, math.Nextafter(f, math.Inf(1)), math.Nextafter(f, math.Inf(-1)), float64(m))
	}
	for _, f := range []float64{maxCentis, -maxCentis, math.Nextafter(maxCentis, 0), 1e-6, 0.005, 0.015, 0.001,
		math.Copysign(0, -1), 0, 99.99, 100, 999.995, 0.1 + 0.2} {
		cases = append(cases, f, math.Nextafter(f, math.Inf(1)), math.Nextafter(f, math.Inf(-1)))
	}
	taken := 0
	for _, f := range cases {
		if _, ok := centis(f); ok {
			taken++
		}
		if got := string(appendFloat(nil, f)); got != wantFloat(t, f) {
			t.Fatalf("%v (bits %x): got %s, want %s", f, math.Float64bits(f), got, wantFloat(t, f))
		}
	}
	require.Greater(t, taken, len(cases)/3, "the fast path is taken for two-decimal values")
	_, ok := centis(21.37)
	require.True(t, ok)
	_, ok = centis(21.375)
	require.False(t, ok)
}

func FuzzAppendFloat(f *testing.F) {
	for _, x := range []float64{0, 21.37, -0.01, 1e-7, 123456.78, 1e21, maxCentis - 0.01} {
		f.Add(x)
	}
	f.Fuzz(func(t *testing.T, x float64) {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			t.Skip()
		}
		require.Equal(t, wantFloat(t, x), string(appendFloat(nil, x)), "%v", x)
		// The decimal neighbours of x with two digits, where the fast
		// path is taken.
		c := math.Round(x*100) / 100
		if math.IsInf(c, 0) {
			return
		}
		require.Equal(t, wantFloat(t, c), string(appendFloat(nil, c)), "%v", c)
		if _, ok := centis(c); ok {
			require.Equal(t, strconv.FormatFloat(c, 'f', -1, 64), string(appendFloat(nil, c)), "%v", c)
		}
	})
}
