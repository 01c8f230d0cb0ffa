package ingest

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest/lineproto"
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
	return &Publisher{js: js, stream: c.Stream, rejected: c.RejectedStream}, nil
}

// Publish sends msgs and waits for every ack; it returns the first
// error.
func (p *Publisher) Publish(ctx context.Context, msgs []lineproto.Message) error {
	for start := 0; start < len(msgs); start += publishWindow {
		batch := msgs[start:min(start+publishWindow, len(msgs))]
		futs := make([]jetstream.PubAckFuture, 0, len(batch))
		for _, m := range batch {
			nm := nats.NewMsg(m.Subject)
			nm.Data = m.Data
			for k, v := range m.Header {
				nm.Header.Set(k, v)
			}
			opts := []jetstream.PublishOpt{jetstream.WithExpectStream(p.stream)}
			if topology.IsRejected(m.Subject) {
				opts = []jetstream.PublishOpt{jetstream.WithMsgID(m.MsgID), jetstream.WithExpectStream(p.rejected)}
			}
			f, err := p.js.PublishMsgAsync(nm, opts...)
			if err != nil {
				return fmt.Errorf("publish to %s: %w", m.Subject, err)
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
