package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest/partition"
)

// entry is one reading the harness sent: reading seq of device dev,
// stamped base + seq ms, carrying seq as its value.
type entry struct {
	dev     int
	via     string    // "nats-<i>" (a JetStream publish to that server first) or "node-<j>" (a line protocol write)
	sent    time.Time // first attempt
	acked   time.Time // zero: never acked
	partial bool      // a line protocol write answered 503 that may have stored it
}

// ledger records every reading sent and every ack, and the writes'
// answers per node and partition.
type ledger struct {
	base       time.Time
	devices    int
	partitions int

	next atomic.Int64
	mu   sync.Mutex
	e    map[int]*entry
	// writes are the line protocol answers, for the serving record.
	writes []answer
}

// answer is one node's answer to a write or a query about a partition.
type answer struct {
	at        time.Time
	node      string
	partition int
	status    int // 0: no answer (transport error)
}

func newLedger(devices, partitions int) *ledger {
	return &ledger{base: time.Now().Add(-time.Hour).Truncate(time.Second), devices: devices, partitions: partitions, e: map[int]*entry{}}
}

// deviceName is the ID of device d.
func deviceName(d int) string { return fmt.Sprintf("fault-%03d", d) }

func (l *ledger) partitionOf(d int) int { return partition.Of(l.partitions, deviceName(d)) }

// ts is reading seq's timestamp.
func (l *ledger) ts(seq int) time.Time { return l.base.Add(time.Duration(seq) * time.Millisecond) }

// take numbers a new reading of a random device.
func (l *ledger) take(rng *rand.Rand, via string) (seq, dev int) {
	seq = int(l.next.Add(1) - 1)
	dev = rng.IntN(l.devices)
	l.mu.Lock()
	l.e[seq] = &entry{dev: dev, via: via, sent: time.Now()}
	l.mu.Unlock()
	return seq, dev
}

func (l *ledger) ack(seq int) {
	l.mu.Lock()
	if e := l.e[seq]; e.acked.IsZero() {
		e.acked = time.Now()
	}
	l.mu.Unlock()
}

func (l *ledger) markPartial(seq int) {
	l.mu.Lock()
	l.e[seq].partial = true
	l.mu.Unlock()
}

// get returns a copy of reading seq's entry.
func (l *ledger) get(seq int) (entry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.e[seq]
	if !ok {
		return entry{}, false
	}
	return *e, true
}

// ackedOf returns the readings of device d acked before t.
func (l *ledger) ackedOf(d int, before time.Time) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int
	for seq, e := range l.e {
		if e.dev == d && !e.acked.IsZero() && e.acked.Before(before) {
			out = append(out, seq)
		}
	}
	return out
}

func (l *ledger) counts() (sent, acked int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.e {
		sent++
		if !e.acked.IsZero() {
			acked++
		}
	}
	return sent, acked
}

func (l *ledger) recordWrite(a answer) {
	l.mu.Lock()
	l.writes = append(l.writes, a)
	l.mu.Unlock()
}

// natsClient publishes readings with JetStream acks to the cluster,
// preferring server first, one reading per message, and records each
// ack. A publish that fails is sent again with the same Nats-Msg-Id
// (and the same reading) for up to retryFor, as a device would.
type natsClient struct {
	led    *ledger
	urls   []string // the NATS servers, the preferred one first
	name   string
	rate   float64 // readings per second
	rng    *rand.Rand
	log    *slog.Logger
	errors atomic.Int64
}

const retryFor = 20 * time.Second

func (c *natsClient) run(ctx context.Context) error {
	nc, err := nats.Connect(joinURLs(c.urls), nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(200*time.Millisecond), nats.Timeout(2*time.Second))
	if err != nil {
		return fmt.Errorf("%s: connect: %w", c.name, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / c.rate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		seq, dev := c.led.take(c.rng, c.name)
		msg := nats.NewMsg("telemetry." + deviceName(dev))
		msg.Data = fmt.Appendf(nil, `[{"ts":%d,"seq":%d}]`, c.led.ts(seq).UnixMilli(), seq)
		msg.Header.Set(jetstream.MsgIDHeader, "fault-"+strconv.Itoa(seq))
		until := time.Now().Add(retryFor)
		for ctx.Err() == nil && time.Now().Before(until) {
			pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, err := js.PublishMsg(pctx, msg)
			cancel()
			if err == nil {
				c.led.ack(seq)
				break
			}
			c.errors.Add(1)
			sleepCtx(ctx, 100*time.Millisecond)
		}
	}
}

// httpWriter writes readings as line protocol to the nodes in turn,
// recording which node answered for which partition, and acks a
// reading on a 204.
type httpWriter struct {
	led    *ledger
	nodes  []string // base URLs
	rate   float64
	rng    *rand.Rand
	client *http.Client
	errors atomic.Int64
}

func (w *httpWriter) run(ctx context.Context) error {
	tick := time.NewTicker(time.Duration(float64(time.Second) / w.rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		j := i % len(w.nodes)
		node := fmt.Sprintf("node-%d", j)
		seq, dev := w.led.take(w.rng, node)
		body := fmt.Appendf(nil, "f,device=%s seq=%di %d\n", deviceName(dev), seq, w.led.ts(seq).UnixMilli())
		status := w.write(ctx, w.nodes[j], body)
		w.led.recordWrite(answer{at: time.Now(), node: node, partition: w.led.partitionOf(dev), status: status})
		switch status {
		case http.StatusNoContent:
			w.led.ack(seq)
		case http.StatusServiceUnavailable:
			w.led.markPartial(seq)
			w.errors.Add(1)
		default:
			w.errors.Add(1)
		}
	}
}

// write posts body and returns the status, 0 when none came.
func (w *httpWriter) write(ctx context.Context, base string, body []byte) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v2/write?bucket=faults&precision=ms", bytes.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	resp, err := w.client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func joinURLs(urls []string) string {
	s := ""
	for i, u := range urls {
		if i > 0 {
			s += ","
		}
		s += u
	}
	return s
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
