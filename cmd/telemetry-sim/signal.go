package main

import (
	"math"
	"math/rand/v2"
	"strconv"
)

// Built-in value names, in the order -values adds them. Beyond these,
// -values adds sensor_4, sensor_5, ...
var baseNames = []string{"temp", "humidity", "battery"}

// valueNames returns the n value names every reading carries.
func valueNames(n int) []string {
	names := make([]string, 0, n)
	for i := 0; i < n; i++ {
		if i < len(baseNames) {
			names = append(names, baseNames[i])
		} else {
			names = append(names, "sensor_"+strconv.Itoa(i+1))
		}
	}
	return names
}

// Signal shapes. Temperatures swing a few degrees around a base over
// tens of minutes; humidity wanders and drifts back to its base;
// batteries lose about one percent an hour and are swapped when low.
const (
	tempNoise          = 0.05 // °C standard deviation per sample
	humidityStep       = 0.5  // %RH standard deviation per √s of elapsed time
	humidityPull       = 0.01 // fraction of the distance to base recovered per second
	batteryLow         = 5.0  // % at which the battery is swapped for a full one
	maxStepSeconds     = 60.0 // longer gaps are treated as one minute
	extraNoiseFraction = 0.01 // noise of sensor_N as a fraction of its amplitude
)

// wave is a slow sine: base + amp·sin(2π·t/period + phase).
type wave struct {
	base, amp, period, phase float64
}

func (w wave) at(seconds float64) float64 {
	return w.base + w.amp*math.Sin(2*math.Pi*seconds/w.period+w.phase)
}

// sensors is the signal state of one device. It is deterministic for
// a given random source and sequence of timestamps, and not safe for
// concurrent use.
type sensors struct {
	rng      *rand.Rand
	temp     wave
	humidity float64
	humBase  float64
	battery  float64
	drainPS  float64 // battery percent lost per second
	extra    []wave
	lastUS   int64 // timestamp of the previous sample; 0 before the first
}

// newSensors draws a device's personality from rng: its base
// temperature, humidity, battery level and drain rate.
func newSensors(rng *rand.Rand, values int) *sensors {
	s := &sensors{
		rng: rng,
		temp: wave{
			base:   18 + 6*rng.Float64(),
			amp:    1.5 + 2.5*rng.Float64(),
			period: 600 + 3000*rng.Float64(),
			phase:  2 * math.Pi * rng.Float64(),
		},
		humBase: 35 + 25*rng.Float64(),
		battery: 60 + 40*rng.Float64(),
		drainPS: (0.5 + 1.5*rng.Float64()) / 3600,
	}
	s.humidity = s.humBase
	for i := len(baseNames); i < values; i++ {
		s.extra = append(s.extra, wave{
			base:   100 * rng.Float64(),
			amp:    1 + 9*rng.Float64(),
			period: 60 + 3600*rng.Float64(),
			phase:  2 * math.Pi * rng.Float64(),
		})
	}
	return s
}

// sample advances the signals to us (epoch microseconds, never before
// the previous sample) and fills dst with one value per name, rounded
// to two decimals.
func (s *sensors) sample(us int64, dst []float64) {
	dt := 0.0
	if s.lastUS != 0 {
		dt = min(float64(us-s.lastUS)/1e6, maxStepSeconds)
	}
	s.lastUS = us
	t := float64(us) / 1e6

	s.humidity += humidityPull*dt*(s.humBase-s.humidity) + humidityStep*math.Sqrt(dt)*s.rng.NormFloat64()
	s.humidity = min(max(s.humidity, 0), 100)
	s.battery -= s.drainPS * dt
	if s.battery < batteryLow {
		s.battery = 100
	}
	for i := range dst {
		var v float64
		switch i {
		case 0:
			v = s.temp.at(t) + tempNoise*s.rng.NormFloat64()
		case 1:
			v = s.humidity
		case 2:
			v = s.battery
		default:
			w := s.extra[i-len(baseNames)]
			v = w.at(t) + extraNoiseFraction*w.amp*s.rng.NormFloat64()
		}
		dst[i] = round2(v)
	}
}
