package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// deviceID names the i-th simulated device (1-based): prefix plus at
// least four digits, so sim-0001 sorts before sim-0010.
func deviceID(prefix string, i int) buckets.DeviceID {
	return buckets.DeviceID(fmt.Sprintf("%s%04d", prefix, i))
}

// device is one simulated device: its identity, signals and counters.
type device struct {
	id      buckets.DeviceID
	subject string
	sensors *sensors
	seq     uint64 // sequence number of the next message
	lastUS  int64  // timestamp of the latest reading, epoch microseconds
}

// message is one encoded message, ready to publish.
type message struct {
	subject  string
	msgID    string // "<device>-<seq>"
	readings int
	data     []byte
}

// fleet generates messages for all devices in turn. Each message
// carries consecutive readings of one device. It is not safe for
// concurrent use.
type fleet struct {
	devices []*device
	names   []string
	pf      payloadFormat
	line    bool  // encode line protocol (-protocol line)
	stepUS  int64 // smallest step between two readings of one device
	now     func() time.Time
	next    int       // index of the device that sends next
	scratch []reading // reused between messages
}

// newFleet builds cfg.Devices devices whose signals derive from seed:
// the same seed gives every device the same personality and noise.
func newFleet(cfg config, seed uint64, now func() time.Time) *fleet {
	f := &fleet{
		devices: make([]*device, cfg.Devices),
		names:   valueNames(cfg.Values),
		pf:      cfg.payloadFormat(),
		line:    cfg.Protocol == "line",
		stepUS:  1,
		now:     now,
	}
	if f.pf.ts == tsEpochMillis {
		f.stepUS = 1000
	}
	for i := range f.devices {
		id := deviceID(cfg.DevicePrefix, i+1)
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		f.devices[i] = &device{
			id:      id,
			subject: topology.For(cfg.SubjectPrefix).Device(string(id)),
			sensors: newSensors(rng, cfg.Values),
			seq:     cfg.SeqStart,
		}
	}
	return f
}

// nextMessage encodes the next n readings of the next device into buf
// (reset to length zero) and returns the message. Readings of one
// device get strictly increasing timestamps, so none merges into
// another at the service: the current time in whole milliseconds, or
// one step after the device's previous reading when it sends more than
// one per millisecond. The step is a microsecond for RFC 3339 and a
// millisecond for epoch-ms, which therefore runs ahead of the clock
// above 1000 readings/s per device.
func (f *fleet) nextMessage(n int, buf []byte) message {
	d := f.devices[f.next]
	f.next = (f.next + 1) % len(f.devices)

	if cap(f.scratch) < n {
		f.scratch = make([]reading, n)
	}
	rs := f.scratch[:n]
	nowUS := f.now().UnixMilli() * 1000
	for i := range rs {
		us := max(nowUS, d.lastUS+f.stepUS)
		d.lastUS = us
		if cap(rs[i].vals) < len(f.names) {
			rs[i].vals = make([]float64, len(f.names))
		}
		rs[i].us = us
		rs[i].vals = rs[i].vals[:len(f.names)]
		d.sensors.sample(us, rs[i].vals)
	}
	m := message{
		subject:  d.subject,
		msgID:    string(d.id) + "-" + strconv.FormatUint(d.seq, 10),
		readings: n,
		data:     f.encode(buf[:0], string(d.id), rs),
	}
	d.seq++
	return m
}
