package ingest

import (
	"cmp"
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/buckets/lineproto"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// publishWindow is how many publishes of one Publish call may await
// their acks at once.
const publishWindow = 256

// Publisher publishes mapped line protocol messages over JetStream:
// readings go to the readings stream, dead letters (rejected.*) to the
// rejected one with their Nats-Msg-Id. The readings stream has no
// duplicate window (streams.go): a retried reading is stored once
// because line protocol readings always carry their time, and the store
// merges readings with the same device and time.
type Publisher struct {
	js       jetstream.JetStream
	subjects topology.Subjects
	stream   string
	rejected string
}

// NewPublisher returns a Publisher on nc to the streams of c.
func NewPublisher(nc *nats.Conn, c Config) (*Publisher, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*publishWindow))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	c = c.withDefaults()
	return &Publisher{js: js, subjects: c.Subjects(), stream: c.Stream, rejected: c.RejectedStream}, nil
}

// Publish sends msgs and waits for every ack; it returns the first
// error. Readings go to <prefix>.<device>; a dead letter goes to
// rejected.<prefix>.<device> (topology.InvalidDeviceToken for one
// without a device) with its code and reason in the headers
// topology.HeaderErrorCode and HeaderError.
func (p *Publisher) Publish(ctx context.Context, msgs []lineproto.Message) error {
	for start := 0; start < len(msgs); start += publishWindow {
		batch := msgs[start:min(start+publishWindow, len(msgs))]
		futs := make([]jetstream.PubAckFuture, 0, len(batch))
		for _, m := range batch {
			nm := p.natsMsg(&m)
			opts := []jetstream.PublishOpt{jetstream.WithExpectStream(p.stream)}
			if m.DeadLetter {
				opts = []jetstream.PublishOpt{jetstream.WithMsgID(m.MsgID), jetstream.WithExpectStream(p.rejected)}
			}
			f, err := p.js.PublishMsgAsync(nm, opts...)
			if err != nil {
				return fmt.Errorf("publish to %s: %w", nm.Subject, err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return fmt.Errorf("publish to %s: %w", f.Msg().Subject, err)
			case <-ctx.Done():
				return fmt.Errorf("publish to %s: %w", f.Msg().Subject, ctx.Err())
			}
		}
	}
	return nil
}

// natsMsg is m on its subject, with its headers.
func (p *Publisher) natsMsg(m *lineproto.Message) *nats.Msg {
	if !m.DeadLetter {
		nm := nats.NewMsg(p.subjects.Device(m.Device))
		nm.Data = m.Data
		for k, v := range m.Header {
			nm.Header.Set(k, v)
		}
		return nm
	}
	nm := nats.NewMsg(p.subjects.Rejected(cmp.Or(m.Device, topology.InvalidDeviceToken)))
	nm.Data = m.Data
	nm.Header.Set(topology.HeaderErrorCode, string(m.Code))
	nm.Header.Set(topology.HeaderError, m.Reason)
	return nm
}
