package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telemetryd/telemetryd/buckets"
)

// deviceIDs returns n device IDs of 31 characters, so that a storage key
// (device, '/', 8 bytes of inverted ticks) is 40 bytes: the shape the
// store's own benchmarks use.
func deviceIDs(n int) []buckets.DeviceID {
	ids := make([]buckets.DeviceID, n)
	for i := range ids {
		ids[i] = buckets.DeviceID(fmt.Sprintf("sensor-building-%02d-floor-%d-%04d", i%20, i%7, i))
	}
	return ids
}

// workload is a fleet replaying its history: message m belongs to
// device m mod D and carries perMsg consecutive readings of it; every
// device's readings are step apart, starting at base. Messages go
// round-robin over the devices, so publishing them in order delivers
// the fleet's readings roughly in time order, as a live fleet would.
// Every reading has three values: temp (float), hum (int), ok (bool).
type workload struct {
	devices []buckets.DeviceID
	perMsg  int
	msgs    int
	base    time.Time
	step    time.Duration
}

// newWorkload returns a workload of at least readings readings (whole
// messages) that ends before end and lies within one UTC day (a day
// boundary would split every commit in two tables; the step shrinks
// when a day cannot hold the readings at step).
func newWorkload(devices []buckets.DeviceID, readings, perMsg int, step time.Duration, end time.Time) workload {
	w := workload{devices: devices, perMsg: perMsg, msgs: max(1, (readings+perMsg-1)/perMsg), step: step}
	if maxStep := 20 * time.Hour / time.Duration(w.perDevice()); w.step > maxStep {
		w.step = max(maxStep, time.Millisecond)
	}
	w.base = fitDay(end, w.span())
	return w
}

// fitDay returns the latest start before end of a span that lies within
// one UTC day.
func fitDay(end time.Time, span time.Duration) time.Time {
	base := end.Add(-span).Truncate(time.Second)
	if dayStart(base) != dayStart(base.Add(span)) {
		base = dayStart(end).Add(-span - time.Second)
	}
	return base
}

// dayStart is the start of t's UTC day.
func dayStart(t time.Time) time.Time { return t.UTC().Truncate(24 * time.Hour) }

// readings is the number of readings of the workload.
func (w workload) readings() int { return w.msgs * w.perMsg }

// rounds is how many messages the busiest device gets.
func (w workload) rounds() int { return (w.msgs + len(w.devices) - 1) / len(w.devices) }

// perDevice is how many readings the busiest device gets.
func (w workload) perDevice() int { return w.rounds() * w.perMsg }

// span is the time from a device's first reading to its last.
func (w workload) span() time.Duration { return time.Duration(w.perDevice()) * w.step }

// device is the device of message m.
func (w workload) device(m int) buckets.DeviceID { return w.devices[m%len(w.devices)] }

// subject is the NATS subject of message m.
func (w workload) subject(m int) string { return "telemetry." + string(w.device(m)) }

// at is the time of reading i of message m.
func (w workload) at(m, i int) time.Time {
	k := (m/len(w.devices))*w.perMsg + i
	return w.base.Add(time.Duration(k) * w.step)
}

// sample returns the values of reading i of message m: a temperature
// with two decimals, a humidity in whole percent and a flag.
func (w workload) sample(m, i int) (temp float64, hum int64, ok bool) {
	k := m*w.perMsg + i
	return float64(1800+(k*37)%1000) / 100, int64(30 + k%40), k%5 != 0 // c/100 is what parsing "18.37" gives
}

// fields appends the values of reading i of message m to dst, sorted by
// name as buckets.Reading requires.
func (w workload) fields(dst []buckets.Field, m, i int) []buckets.Field {
	temp, hum, ok := w.sample(m, i)
	return append(dst,
		buckets.Field{Name: "hum", Value: buckets.Int(hum)},
		buckets.Field{Name: "ok", Value: buckets.Bool(ok)},
		buckets.Field{Name: "temp", Value: buckets.Float(temp)})
}

// appendReadings appends the readings of message m to dst; their
// values live in one new array per call.
func (w workload) appendReadings(dst []buckets.Reading, m int) []buckets.Reading {
	fs := make([]buckets.Field, 0, 3*w.perMsg)
	dev := w.device(m)
	for i := range w.perMsg {
		start := len(fs)
		fs = w.fields(fs, m, i)
		dst = append(dst, buckets.Reading{Device: dev, Ticks: buckets.MustTicks(w.at(m, i)),
			Values: fs[start:len(fs):len(fs)]})
	}
	return dst
}

// count is the number of messages.
func (w workload) count() int { return w.msgs }

// readingsBefore is the number of readings in messages [0, m).
func (w workload) readingsBefore(m int) int { return m * w.perMsg }

// maxReadingJSON bounds the JSON of one reading of payload (54 bytes
// with its separating comma: ts, temp, hum, ok).
const maxReadingJSON = 64

// natsMsg is message m with its payload in a buffer of its own.
func (w workload) natsMsg(m int) *nats.Msg {
	return &nats.Msg{Subject: w.subject(m), Data: w.payload(make([]byte, 0, w.perMsg*maxReadingJSON+2), m)}
}

// payload appends the JSON payload of message m to dst: one flat
// reading object, or an array of them when perMsg > 1.
func (w workload) payload(dst []byte, m int) []byte {
	if w.perMsg > 1 {
		dst = append(dst, '[')
	}
	for i := range w.perMsg {
		if i > 0 {
			dst = append(dst, ',')
		}
		temp, hum, ok := w.sample(m, i)
		dst = append(dst, `{"ts":`...)
		dst = strconv.AppendInt(dst, w.at(m, i).UnixMilli(), 10)
		dst = append(dst, `,"temp":`...)
		dst = strconv.AppendFloat(dst, temp, 'f', 2, 64) // always a float, never an int
		dst = append(dst, `,"hum":`...)
		dst = strconv.AppendInt(dst, hum, 10)
		dst = append(dst, `,"ok":`...)
		dst = strconv.AppendBool(dst, ok)
		dst = append(dst, '}')
	}
	if w.perMsg > 1 {
		dst = append(dst, ']')
	}
	return dst
}
