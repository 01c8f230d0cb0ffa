package main

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTestSensors(t *testing.T, seed uint64, values int) *sensors {
	t.Helper()
	return newSensors(rand.New(rand.NewPCG(seed, 0)), values)
}

// sampleAll runs s through n samples step apart and returns them.
func sampleAll(s *sensors, values, n int, step time.Duration) [][]float64 {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	out := make([][]float64, n)
	for i := range out {
		out[i] = make([]float64, values)
		s.sample(start+int64(i)*step.Microseconds(), out[i])
	}
	return out
}

func TestSensorsBoundedAndRounded(t *testing.T) {
	steps := []time.Duration{time.Millisecond, time.Second, time.Minute, time.Hour}
	for _, step := range steps {
		t.Run(step.String(), func(t *testing.T) {
			for seed := uint64(1); seed <= 10; seed++ {
				for i, v := range sampleAll(newTestSensors(t, seed, 5), 5, 2000, step) {
					if v[1] < 0 || v[1] > 100 || v[2] < batteryLow || v[2] > 100 || v[0] < -10 || v[0] > 40 {
						t.Fatalf("seed %d sample %d: temp %v humidity %v battery %v out of bounds", seed, i, v[0], v[1], v[2])
					}
					for j, x := range v {
						if math.IsNaN(x) || math.IsInf(x, 0) || x != round2(x) {
							t.Fatalf("seed %d sample %d: value %d = %v is not finite with two decimals", seed, i, j, x)
						}
					}
				}
			}
		})
	}
}

func TestHumidityClampedAtBothEnds(t *testing.T) {
	for _, start := range []float64{0, 100} {
		s := newTestSensors(t, 7, 3)
		s.humidity, s.humBase = start, start
		var low, high float64 = 100, 0
		for _, v := range sampleAll(s, 3, 5000, time.Minute) {
			low, high = min(low, v[1]), max(high, v[1])
		}
		assert.GreaterOrEqual(t, low, 0.0)
		assert.LessOrEqual(t, high, 100.0)
		assert.True(t, low == start || high == start, "humidity never touched the clamp at %v (range %v..%v)", start, low, high)
	}
}

func TestTemperatureIsSmooth(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		samples := sampleAll(newTestSensors(t, seed, 3), 3, 3600, time.Second)
		var maxDelta, lo, hi float64 = 0, 100, -100
		for i := 1; i < len(samples); i++ {
			maxDelta = max(maxDelta, math.Abs(samples[i][0]-samples[i-1][0]))
			lo, hi = min(lo, samples[i][0]), max(hi, samples[i][0])
		}
		assert.Less(t, maxDelta, 0.5, "seed %d: temperature jumped %v °C in one second", seed, maxDelta)
		assert.Greater(t, hi-lo, 1.0, "seed %d: temperature is flat over an hour (%v..%v)", seed, lo, hi)
	}
}

func TestHumidityStepsAreSmall(t *testing.T) {
	samples := sampleAll(newTestSensors(t, 3, 3), 3, 3600, time.Second)
	for i := 1; i < len(samples); i++ {
		require.Less(t, math.Abs(samples[i][1]-samples[i-1][1]), 3.0, "sample %d", i)
	}
}

func TestBatteryDrainsSlowly(t *testing.T) {
	s := newTestSensors(t, 5, 3)
	s.battery = 50
	samples := sampleAll(s, 3, 3600, time.Second)
	for i := 1; i < len(samples); i++ {
		require.LessOrEqual(t, samples[i][2], samples[i-1][2], "battery rose at sample %d", i)
	}
	drained := samples[0][2] - samples[len(samples)-1][2]
	assert.True(t, drained >= 0.4 && drained <= 2.1, "drained %v%% in an hour, want about 0.5..2", drained)
}

func TestBatterySwappedWhenLow(t *testing.T) {
	s := newTestSensors(t, 5, 3)
	s.battery = batteryLow + 0.001
	samples := sampleAll(s, 3, 120, time.Minute)
	var swapped bool
	for _, v := range samples {
		swapped = swapped || v[2] > 99
	}
	assert.True(t, swapped, "battery never replaced after dropping below %v%%", batteryLow)
}

func TestSensorsDeterministicBySeed(t *testing.T) {
	a := sampleAll(newTestSensors(t, 42, 6), 6, 100, time.Second)
	b := sampleAll(newTestSensors(t, 42, 6), 6, 100, time.Second)
	c := sampleAll(newTestSensors(t, 43, 6), 6, 100, time.Second)
	assert.Equal(t, a, b)
	assert.NotEqual(t, a, c)
}
