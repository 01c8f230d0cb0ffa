package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/lineproto"
)

// publishWindow is how many publishes of one request may await their
// acks at once.
const publishWindow = 256

// jsPublisher implements api.Publisher over JetStream: readings go to
// the telemetry stream, dead letters (rejected.*) to the rejected one
// with their Nats-Msg-Id. The telemetry stream has no duplicate window
// (package ingest, streams.go): a retried reading is stored once
// because line protocol readings always carry their time, and the
// store merges readings with the same device and time.
type jsPublisher struct {
	js       jetstream.JetStream
	stream   string
	rejected string
}

var _ api.Publisher = (*jsPublisher)(nil)

func newJSPublisher(nc *nats.Conn) (*jsPublisher, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*publishWindow))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	d := ingest.DefaultConfig()
	return &jsPublisher{js: js, stream: d.Stream, rejected: d.RejectedStream}, nil
}

// Publish sends msgs and waits for every ack; it returns the first
// error.
func (p *jsPublisher) Publish(ctx context.Context, msgs []lineproto.Message) error {
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
			if strings.HasPrefix(m.Subject, "rejected.") {
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

// withWrites configures the line protocol write endpoints.
func (m *Main) withWrites(acfg *api.Config) error {
	nc, err := m.dialNATS("telemetryd-writes")
	if err != nil {
		return fmt.Errorf("api writes: %w", err)
	}
	m.writesNC = nc
	pub, err := newJSPublisher(nc)
	if err != nil {
		return fmt.Errorf("api writes: %w", err)
	}
	tags, err := m.cfg.lineDeviceTags()
	if err != nil {
		return err
	}
	mode, err := m.cfg.lineTags()
	if err != nil {
		return err
	}
	acfg.Writes = &api.WriteConfig{
		Publisher:     pub,
		SubjectPrefix: m.cfg.SubjectPrefix,
		DeviceTags:    tags,
		Tags:          mode,
		MaxBytes:      m.cfg.MaxWriteBytes,
		Window:        m.window(),
		Budget:        m.budget.Writes,
	}
	// Leave room for headers within the server's max payload (unknown,
	// so the 1 MiB default, until the first connect).
	if mp := int(m.nc.MaxPayload()); mp >= 64<<10 {
		acfg.Writes.MaxMessageBytes = mp - 4096
	}
	return nil
}
