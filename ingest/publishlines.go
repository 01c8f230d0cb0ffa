package ingest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/buckets/wire"
	"github.com/telemetryd/telemetryd/ingest/lpwire"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// A line protocol write's readings go as one message per partition (or
// a few, past the max payload) in the form of package lpwire, each with
// the message ID lpwire.ID of its subject and content. The Publisher
// remembers the IDs of the messages its streams acknowledged for
// recentFor (at most maxRecent of them) and does not publish such a
// message again: an identical retry of a write is suppressed, and since
// the ID names the content nothing else ever is. The streams themselves
// keep no duplicate window (streams.go), so a retry after the Publisher
// forgot is published and merges in the store.
const (
	recentFor = 2 * time.Minute
	maxRecent = 1 << 14
	// payloadHeadroom is what a message's headers may take of the
	// server's max payload.
	payloadHeadroom = 4 << 10
)

// recentIDs are the IDs of the messages acknowledged lately, oldest
// first.
type recentIDs struct {
	mu    sync.Mutex
	at    map[string]time.Time
	order []string
}

// has reports whether id was acknowledged within recentFor of now.
func (r *recentIDs) has(id string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.at[id]
	return ok && now.Sub(at) < recentFor
}

// add remembers id as acknowledged at now, forgetting the oldest past
// maxRecent or recentFor.
func (r *recentIDs) add(id string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at = make(map[string]time.Time)
	}
	if _, ok := r.at[id]; !ok {
		r.order = append(r.order, id)
	}
	r.at[id] = now
	for len(r.order) > 0 && (len(r.order) > maxRecent || now.Sub(r.at[r.order[0]]) >= recentFor) {
		delete(r.at, r.order[0])
		r.order[0] = ""
		r.order = r.order[1:]
	}
}

// linesMsg is one message of a write in the form of package lpwire.
type linesMsg struct {
	stream string
	msg    *nats.Msg
	id     string
}

// group gathers the readings of msgs in the binary form of package wire
// into messages of package lpwire, per partition, each at most the
// server's max payload; it returns them and the messages left to
// publish one by one (dead letters, other forms, a device's payload too
// large to share a message).
func (p *Publisher) group(msgs []linemsg.Message) ([]linesMsg, []linemsg.Message) {
	limit := int(p.nc.MaxPayload()) - payloadHeadroom
	type part struct {
		entries []lpwire.Entry
		size    int
	}
	parts := map[int]*part{}
	var order []int
	var out []linesMsg
	var rest []linemsg.Message
	flush := func(n int, pt *part) {
		if len(pt.entries) == 0 {
			return
		}
		out = append(out, p.linesMsg(n, lpwire.Append(make([]byte, 0, pt.size), pt.entries)))
		clear(pt.entries)
		pt.entries, pt.size = pt.entries[:0], lpwire.HeadSize
	}
	for i := range msgs {
		m := &msgs[i]
		if m.DeadLetter || m.Header[wire.Header] != wire.Format || m.Device == "" || len(m.Data) == 0 {
			rest = append(rest, *m)
			continue
		}
		size := lpwire.EntrySize(m.Device, len(m.Data))
		if lpwire.HeadSize+size > limit {
			rest = append(rest, *m)
			continue
		}
		n := 0
		if p.partitions > 0 {
			n = partition.Of(p.partitions, m.Device)
		}
		pt := parts[n]
		if pt == nil {
			pt = &part{size: lpwire.HeadSize}
			parts[n] = pt
			order = append(order, n)
		}
		if pt.size+size > limit || len(pt.entries) == lpwire.MaxDevices {
			flush(n, pt)
		}
		pt.entries = append(pt.entries, lpwire.Entry{Device: buckets.DeviceID(m.Device), Payload: m.Data})
		pt.size += size
	}
	for _, n := range order {
		flush(n, parts[n])
	}
	return out, rest
}

// linesMsg is the message of partition n (0 without partitions) with
// data.
func (p *Publisher) linesMsg(n int, data []byte) linesMsg {
	subject := p.subjects.Device(lpwire.Token)
	stream := p.stream
	if p.partitions > 0 {
		subject = p.subjects.Prefix + "." + strconv.Itoa(n) + "." + lpwire.Token
		if p.intake {
			subject = IntakeSubject(p.subjects.Prefix, n, lpwire.Token)
		}
		stream = partition.Stream(p.family, n)
	}
	nm := nats.NewMsg(subject)
	nm.Data = data
	nm.Header.Set(lpwire.Header, lpwire.Format)
	return linesMsg{stream: stream, msg: nm, id: lpwire.ID(subject, data)}
}

// publishLines publishes msgs, but those acknowledged within recentFor,
// and waits for every ack.
func (p *Publisher) publishLines(ctx context.Context, msgs []linesMsg) error {
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		if p.recent.has(m.id, p.now()) {
			p.suppressed.Add(1)
			continue
		}
		f, err := p.js.PublishMsgAsync(m.msg, jetstream.WithMsgID(m.id), jetstream.WithExpectStream(m.stream))
		if err != nil {
			return fmt.Errorf("publish to %s: %w", m.msg.Subject, err)
		}
		futs = append(futs, f)
		ids = append(ids, m.id)
	}
	for i, f := range futs {
		select {
		case <-f.Ok():
			p.recent.add(ids[i], p.now())
		case err := <-f.Err():
			return fmt.Errorf("publish to %s: %w", f.Msg().Subject, err)
		case <-ctx.Done():
			return fmt.Errorf("publish to %s: %w", f.Msg().Subject, ctx.Err())
		}
	}
	return nil
}
