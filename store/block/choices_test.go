package block

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// simulated returns n readings 10 s apart shaped like the simulator's:
// a temperature on a slow wave with 0.05 noise, a humidity random walk
// and a draining battery, all with two decimals.
func simulated(n int) []buckets.Reading {
	rng := rand.New(rand.NewPCG(3, 3))
	k0 := buckets.MustTicks(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	hum, bat := 45.0, 100.0
	rs := make([]buckets.Reading, n)
	for i := range rs {
		t := float64(i * 10)
		temp := 21 + 5*math.Sin(2*math.Pi*t/1800) + 0.05*rng.NormFloat64()
		hum = min(max(hum+0.01*10*(45-hum)+0.5*math.Sqrt(10)*rng.NormFloat64(), 0), 100)
		bat -= 0.0004
		r2 := func(x float64) buckets.Value { return buckets.Float(math.Round(x*100) / 100) }
		rs[i] = buckets.Reading{Ticks: k0 + buckets.Ticks(i)*10*buckets.TicksPerSecond, Values: []buckets.Field{
			{Name: "battery", Value: r2(bat)}, {Name: "humidity", Value: r2(hum)}, {Name: "temp", Value: r2(temp)}}}
	}
	return rs
}

// TestEncodingChoices prints bytes per reading of each format choice
// on simulator-shaped data (go test -run TestEncodingChoices -v
// ./store/block); BENCHMARKS.md records the table. It fails if the
// chosen encoding is not the smallest.
func TestEncodingChoices(t *testing.T) {
	for _, n := range []int{100, 360, 2048} {
		rs := simulated(n)
		size := func(e encoding) float64 {
			b, err := encode(nil, rs, e)
			require.NoError(t, err)
			return float64(len(b)) / float64(n)
		}
		chosen := size(encoding{})
		xor := size(encoding{xorOnly: true})
		plain := size(encoding{noZstd: true})
		plainXOR := size(encoding{noZstd: true, xorOnly: true})
		t.Logf("%4d readings: decimal+zstd %.2f B/reading, XOR+zstd %.2f, decimal without zstd %.2f, XOR without zstd %.2f",
			n, chosen, xor, plain, plainXOR)
		require.LessOrEqual(t, chosen, min(xor, plain, plainXOR))
	}
}
