package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publisher sends every message of the run until JetStream acked it,
// retrying with the same Nats-Msg-Id across service restarts.
type publisher struct {
	js     jetstream.JetStream
	send   func(m int) (<-chan error, error) // publishes message m; the channel reports its ack; nil: JetStream
	cfg    Config
	base   time.Time // reading seq is stamped base + seq ms
	field  string    // the value that carries seq once stored; empty: seq
	acked  atomic.Int64
	errors atomic.Int64
	// next is the first message not yet sent (retries aside).
	next atomic.Int64
	// duplicates counts acks that said duplicate: a retry of a message
	// stored before its first ack was lost, or a message whose ID
	// another client took first.
	duplicates atomic.Int64
	// ackedMsg[m] is whether message m was acked, and ackedAt[m] when
	// its (first) ack arrived; written by run only, read after it
	// returned.
	ackedMsg []bool
	ackedAt  []time.Time
	// inFlight is the messages sent and not yet answered: an answer
	// counts off as it arrives (waitAck), before the run loop handles
	// it. A cut is timed by it.
	inFlight atomic.Int64
	// dupAcked[m] is whether message m's ack said duplicate.
	dupAcked []atomic.Bool
	// ackedSeqs is, per stream, the highest sequence a JetStream ack
	// named (checkStreams).
	ackedSeqs streamSeqs
	// pacer says when each new message is due (nil: as fast as acks
	// allow); run makes it from Config.Rate unless set, the kill loop
	// plans it again after each cut.
	pacer *pacer
	start time.Time // when publishing started (set with pacer)
}

// readingsBase is the time of reading 0 of a run that starts at now
// and publishes n readings one millisecond apart: an hour back, or
// further when the run holds more than an hour of readings, so that
// every reading is in the past when publishing starts. The service
// refuses readings more than -max-future-skew (5 minutes) ahead of its
// clock, and a run publishing faster than 1,000 readings/s would
// otherwise reach them.
func readingsBase(now time.Time, n int) time.Time {
	back := max(time.Hour, time.Duration(n)*time.Millisecond+time.Minute)
	return now.Add(-back).Truncate(time.Second)
}

// errStalled is a run that got no ack for Config.StallTimeout.
var errStalled = errors.New("publishing stalled")

const maxInFlight = 512

// seqField is the value that carries a reading's number once stored.
func (p *publisher) seqField() string { return cmp.Or(p.field, "seq") }

func (p *publisher) messages() int { return (p.cfg.Readings + p.cfg.Batch - 1) / p.cfg.Batch }

// device returns the device that message m belongs to.
func (p *publisher) device(m int) string { return deviceName(m % p.cfg.Devices) }

// deviceName is the ID of device d of the loop.
func deviceName(d int) string { return fmt.Sprintf("crash-%03d", d) }

// deviceOf returns the index of the device reading seq belongs to: its
// message's, or with Config.Spread its own.
func (p *publisher) deviceOf(seq int) int {
	if p.cfg.Spread {
		return seq % p.cfg.Devices
	}
	return seq / p.cfg.Batch % p.cfg.Devices
}

// message builds message m: a JSON array of readings with consecutive
// sequence numbers.
func (p *publisher) message(m int) *nats.Msg {
	first, last := m*p.cfg.Batch, min((m+1)*p.cfg.Batch, p.cfg.Readings)
	buf := []byte{'['}
	for seq := first; seq < last; seq++ {
		if seq > first {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"ts":`...)
		buf = strconv.AppendInt(buf, p.base.UnixMilli()+int64(seq), 10)
		buf = append(buf, `,"seq":`...)
		buf = strconv.AppendInt(buf, int64(seq), 10)
		buf = append(buf, '}')
	}
	buf = append(buf, ']')
	msg := nats.NewMsg("telemetry." + p.device(m))
	msg.Data = buf
	msg.Header.Set(jetstream.MsgIDHeader, msgID(m))
	return msg
}

// msgID is the Nats-Msg-Id of message m. It is predictable on purpose:
// -hostile copies it.
func msgID(m int) string { return "crash-" + strconv.Itoa(m) }

type pubResult struct {
	m   int
	err error
	at  time.Time // when the answer came, before the loop got to it
}

// run publishes every message, keeping at most maxInFlight unacked,
// and returns when all are acked or ctx ends, or with errStalled when
// no ack came for Config.StallTimeout.
func (p *publisher) run(ctx context.Context, log *slog.Logger) error {
	total := p.messages()
	p.ackedMsg = make([]bool, total)
	p.ackedAt = make([]time.Time, total)
	p.dupAcked = make([]atomic.Bool, total)
	results := make(chan pubResult, maxInFlight)
	var retry []int
	next, done, inflight := 0, 0, 0
	started := time.Now()
	if p.pacer == nil {
		p.pacer = newPacer(started, p.cfg.Rate, p.cfg.Batch)
	}
	lastAck := started
	var backoffUntil time.Time // a refused publish (a full stream, a server going down) is not sent again at once
	handle := func(r pubResult) {
		inflight--
		if r.err != nil {
			p.errors.Add(1)
			retry = append(retry, r.m)
			backoffUntil = time.Now().Add(retryBackoff)
			return
		}
		done++
		lastAck = time.Now()
		if !p.ackedMsg[r.m] {
			p.ackedAt[r.m] = r.at
		}
		p.ackedMsg[r.m] = true
		p.acked.Add(int64(min((r.m+1)*p.cfg.Batch, p.cfg.Readings) - r.m*p.cfg.Batch))
	}
	stallCheck := time.NewTicker(time.Second)
	defer stallCheck.Stop()
	for done < total {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p.cfg.StallTimeout > 0 && time.Since(lastAck) > p.cfg.StallTimeout {
			log.Warn("publishing stalled", "acked_messages", done, "messages", total, "no_ack_for", p.cfg.StallTimeout)
			return fmt.Errorf("%w: no ack for %s, %d of %d messages acked", errStalled, p.cfg.StallTimeout, done, total)
		}
		if inflight < maxInFlight && (len(retry) > 0 || next < total) {
			var m int
			if len(retry) > 0 {
				if d := time.Until(backoffUntil); d > 0 {
					time.Sleep(d)
				}
				m, retry = retry[0], retry[1:]
			} else {
				m, next = next, next+1
				p.pace(ctx, m)
				p.next.Store(int64(next))
			}
			p.inFlight.Add(1)
			done, err := p.publish(m)
			if err != nil {
				p.inFlight.Add(-1)
				p.errors.Add(1)
				retry = append(retry, m)
				time.Sleep(retryBackoff)
				continue
			}
			inflight++
			go p.waitAck(ctx, done, m, results)
		} else {
			select {
			case r := <-results:
				handle(r)
			case <-stallCheck.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		for drained := false; !drained; {
			select {
			case r := <-results:
				handle(r)
			default:
				drained = true
			}
		}
	}
	log.Info("every message acked", "messages", total, "readings", p.acked.Load(), "publish_errors", p.errors.Load())
	return nil
}

// retryBackoff is how long the publisher waits before sending again a
// message whose publish failed, as a device would.
const retryBackoff = 20 * time.Millisecond

// pace waits until message m is due when Config.Rate limits readings
// per second; the kill loop may plan again meanwhile (pacer), so the
// wait looks again at least every paceRecheck.
func (p *publisher) pace(ctx context.Context, m int) {
	if p.pacer == nil {
		return
	}
	for {
		d := time.Until(p.pacer.due(m))
		if d <= 0 {
			return
		}
		select {
		case <-time.After(min(d, paceRecheck)):
		case <-ctx.Done():
			return
		}
	}
}

// paceRecheck bounds a wait for a message's due time.
const paceRecheck = 100 * time.Millisecond

// replanAfterCut plans the rest of the run after the kill loop's done-th
// cut and the restart after it (cutInterval): publishing started at
// started, the previous cut's restart ended at prev. It returns the
// new rate in readings per second (0: not paced).
func (p *publisher) replanAfterCut(now, started, prev time.Time, done, kills int) float64 {
	if p.pacer == nil {
		return 0
	}
	next := int(p.next.Load())
	base := rateInterval(p.cfg.Rate, p.cfg.Batch)
	every := cutInterval(p.messages()-next, done, kills, now.Sub(started), now.Sub(prev), base)
	p.pacer.replan(now, next, every)
	return float64(p.cfg.Batch) / every.Seconds()
}

// publish sends message m through p.send, or JetStream when it is
// nil; the channel yields nil once m is acknowledged.
func (p *publisher) publish(m int) (<-chan error, error) {
	if p.send != nil {
		return p.send(m)
	}
	fut, err := p.js.PublishMsgAsync(p.message(m))
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() {
		select {
		case ack := <-fut.Ok():
			p.ackedSeqs.note(ack.Stream, ack.Sequence)
			if !ack.Duplicate {
				p.ackedSeqs.noteMsg(m, ack.Stream, ack.Sequence)
			}
			if ack.Duplicate {
				p.duplicates.Add(1)
				p.dupAcked[m].Store(true)
			}
			done <- nil
		case err := <-fut.Err():
			done <- err
		}
	}()
	return done, nil
}

// waitAck hands message m's answer to the run loop.
func (p *publisher) waitAck(ctx context.Context, done <-chan error, m int, out chan<- pubResult) {
	select {
	case err := <-done:
		p.inFlight.Add(-1)
		out <- pubResult{m: m, err: err, at: time.Now()}
	case <-ctx.Done():
	}
}

// awaitInFlight waits, at most wait, until a publish is out and
// not yet answered, and returns how many are (0: none came).
func (p *publisher) awaitInFlight(ctx context.Context, wait time.Duration) int64 {
	deadline := time.Now().Add(wait)
	for {
		if n := p.inFlight.Load(); n > 0 || ctx.Err() != nil || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Microsecond)
	}
}
