package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/telemetryd/telemetryd/cmd/internal/exactlyonce"
)

// The QoS 0 probe of a -hostile run. MQTT QoS 0 readings have no
// acknowledgement, so the loop cannot count them; yet the service must
// not lose them to an auth file reload (its own connections stay up).
// After the loop, with no kills and no flood but the auth file still
// rewritten every second, the probe publishes probeReadings QoS 0
// readings on one MQTT connection between two QoS 1 readings (the
// barriers). A server handles one connection's packets in order, so
// once the closing barrier is PUBACKed every QoS 0 reading before it
// has reached the service; with nothing else going on, each must then
// be stored exactly once.
const (
	probeDevice   = "crash-qos0"
	probeReadings = 1000
	probeRate     = 200 // QoS 0 readings per second: 5 s, a handful of auth reloads
	// probeBarrierWait bounds the retries of a barrier (the stream may
	// still be busy with what the flood left).
	probeBarrierWait = time.Minute
)

// ProbeCounts is what the QoS 0 probe found.
type ProbeCounts struct {
	Sent       int    // QoS 0 readings handed to the connection
	Stored     int    // probe readings read back (barriers included)
	Lost       int    // QoS 0 readings sent, not stored
	Duplicated int    // stored more than once
	Unexpected int    // not of the probe's form
	Unchecked  string // why the QoS 0 readings were not due ("": they were)
}

// OK reports whether the probe checked its readings and found nothing
// wrong.
func (p *ProbeCounts) OK() bool {
	return p.Unchecked == "" && p.Lost == 0 && p.Duplicated == 0 && p.Unexpected == 0
}

func (p *ProbeCounts) String() string {
	s := fmt.Sprintf("qos0_sent=%d stored_with_barriers=%d qos0_lost=%d duplicated=%d unexpected=%d",
		p.Sent, p.Stored, p.Lost, p.Duplicated, p.Unexpected)
	if p.Unchecked != "" {
		s += " unchecked=" + strconv.Quote(p.Unchecked)
	}
	return s
}

// probe publishes and checks the QoS 0 readings.
type probe struct {
	addr, user, password string
	base                 time.Time // reading n is stamped base + n ms
	sent                 []int     // numbers of the QoS 0 readings sent
	barriers             []int     // numbers of the barriers PUBACKed
	lostConn             atomic.Int64
}

// The barriers' numbers follow the QoS 0 readings'.
const (
	openingBarrier = probeReadings
	closingBarrier = probeReadings + 1
)

func (p *probe) payload(n int) []byte {
	return []byte(`[{"ts":` + strconv.FormatInt(p.base.UnixMilli()+int64(n), 10) + `,"seq":` + strconv.Itoa(n) + `}]`)
}

// run publishes the opening barrier, the QoS 0 readings and the closing
// barrier. It returns why the QoS 0 readings cannot be judged, or "".
func (p *probe) run(ctx context.Context) string {
	opts := mqtt.NewClientOptions().AddBroker("tcp://" + p.addr).SetClientID("crashloop-qos0-probe").
		SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).
		SetConnectionLostHandler(func(mqtt.Client, error) { p.lostConn.Add(1) })
	if p.user != "" {
		opts.SetUsername(p.user).SetPassword(p.password)
	}
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		return fmt.Sprintf("mqtt connect %s: %v", p.addr, cmpErr(tok.Error(), errors.New("timed out")))
	}
	defer c.Disconnect(250)
	topic := "telemetry/" + probeDevice
	if err := p.barrier(ctx, c, topic, openingBarrier); err != nil {
		return err.Error()
	}
	t := time.NewTicker(time.Second / probeRate)
	defer t.Stop()
	for n := range probeReadings {
		select {
		case <-ctx.Done():
			return ctx.Err().Error()
		case <-t.C:
		}
		tok := c.Publish(topic, 0, false, p.payload(n))
		if tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
			p.sent = append(p.sent, n)
		}
	}
	if err := p.barrier(ctx, c, topic, closingBarrier); err != nil {
		return err.Error()
	}
	if n := p.lostConn.Load(); n > 0 {
		return fmt.Sprintf("the probe's connection was lost %d times", n)
	}
	return ""
}

// barrier publishes reading n with QoS 1 until it is PUBACKed.
func (p *probe) barrier(ctx context.Context, c mqtt.Client, topic string, n int) error {
	deadline := time.Now().Add(probeBarrierWait)
	var err error
	for time.Now().Before(deadline) {
		tok := c.Publish(topic, 1, false, p.payload(n))
		switch {
		case !tok.WaitTimeout(5 * time.Second):
			err = errors.New("no PUBACK within 5s")
		case tok.Error() != nil:
			err = tok.Error()
		default:
			p.barriers = append(p.barriers, n)
			return nil
		}
		if p.lostConn.Load() > 0 {
			return fmt.Errorf("barrier %d: connection lost: %w", n, err)
		}
		sleep(ctx, 200*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return fmt.Errorf("barrier %d not PUBACKed within %s: %w", n, probeBarrierWait, err)
}

// check reads the probe's readings back, waiting up to timeout for the
// QoS 0 ones still in flight, and counts them into pc.
func (p *probe) check(ctx context.Context, base string, header http.Header, timeout time.Duration, pc *ProbeCounts) error {
	run := exactlyonce.Run{Field: "seq", Base: p.base, Step: time.Millisecond,
		Published: func(n int) bool { return n <= closingBarrier }}
	due := p.barriers
	if pc.Unchecked == "" {
		due = append(append([]int(nil), p.sent...), p.barriers...)
	}
	deadline := time.Now().Add(timeout)
	for {
		got, err := exactlyonce.ReadDevice(ctx, nil, base, probeDevice, p.base.Add(-time.Second),
			p.base.Add((closingBarrier+1)*time.Millisecond), header)
		if err != nil && !errors.Is(err, context.Canceled) && time.Now().Before(deadline) {
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		if err != nil {
			return fmt.Errorf("qos0 probe: %w", err)
		}
		t := run.Check(due, got)
		pc.Sent, pc.Stored, pc.Lost, pc.Duplicated, pc.Unexpected = len(p.sent), t.Stored, t.Lost, t.Duplicated, t.Unexpected
		if t.Lost == 0 || !time.Now().Before(deadline) {
			return nil
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}
