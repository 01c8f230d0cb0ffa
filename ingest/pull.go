package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Pulling what accumulated. A consumer with a pull request waiting is
// pushed each message as its stream stores it; a caught-up consumer
// (with a stream per partition, each of them at one reading a message)
// is then woken, delivers and has the server flush its connection about
// once a message. Instead the ingester asks its consumer every
// PullEvery for what the stream holds: one "no wait" request with an
// expiry, which the server answers with every message available (up to
// the request's batch and bytes) and then ends. When the stream holds
// nothing new the request waits (up to pullExpiry, with idle
// heartbeats) and ends with the first messages that arrive. A busy
// ingester so sends one request every PullEvery and takes its messages
// in bursts; an idle one sends one every pullExpiry.

// pullBatch bounds the messages of one request; the consumer's
// MaxAckPending and the request's bytes bound them too.
const pullBatch = 10000

// pullHeartbeat is the idle heartbeat of a waiting request: nothing
// heard for twice that reports a missed heartbeat.
const pullHeartbeat = pullExpiry / 2

// pullStatus is the header of a status message.
const (
	pullStatus      = "Status"
	pullDescription = "Description"
)

// nextRequest is JetStream's request for the next messages of a pull
// consumer.
type nextRequest struct {
	Batch     int           `json:"batch"`
	MaxBytes  int           `json:"max_bytes,omitempty"`
	NoWait    bool          `json:"no_wait,omitempty"`
	Expires   time.Duration `json:"expires,omitempty"`
	Heartbeat time.Duration `json:"idle_heartbeat,omitempty"`
}

// puller runs the requests of one consume; it is the ConsumeContext
// watch stops.
type puller struct {
	in       *Ingester
	subject  string // the consumer's next-message API subject
	inbox    string
	req      []byte // the request, marshalled once
	maxBytes int
	every    time.Duration
	handle   jetstream.MessageHandler
	sub      *nats.Subscription
	status   chan nats.Status // connection status changes

	ended   chan error   // the request in flight ended (nil) or failed
	gen     atomic.Int64 // of the request in flight; its reply is inbox.<gen>
	stop    chan struct{}
	stopped sync.Once
	done    chan struct{} // the request loop returned
	subDone chan struct{} // the subscription closed, its last callback returned
	closed  chan struct{}

	// Owned by the subscription's callback: the bytes the request in
	// flight (of generation gotGen) delivered so far.
	gotGen   int64
	gotBytes int
	// heard counts what arrived (messages, heartbeats, statuses) so that
	// the loop can tell silence from a long handler.
	heard atomic.Int64
}

// pull starts pulling from cons into handle every in.cfg.PullEvery.
func (in *Ingester) pull(cons jetstream.Consumer, handle jetstream.MessageHandler) (*puller, error) {
	info := cons.CachedInfo()
	maxBytes := max(in.cfg.PullMaxBytes, 2*int(in.nc.MaxPayload()))
	req, err := json.Marshal(nextRequest{Batch: pullBatch, MaxBytes: maxBytes, NoWait: true,
		Expires: pullExpiry, Heartbeat: pullHeartbeat})
	if err != nil {
		return nil, fmt.Errorf("pull request: %w", err)
	}
	p := &puller{
		in:       in,
		subject:  fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.%s.%s", info.Stream, info.Name),
		inbox:    in.nc.NewInbox(),
		req:      req,
		maxBytes: maxBytes,
		every:    in.cfg.PullEvery,
		handle:   handle,
		ended:    make(chan error, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		subDone:  make(chan struct{}),
		closed:   make(chan struct{}),
	}
	p.sub, err = in.nc.Subscribe(p.inbox+".*", p.receive)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", p.inbox, err)
	}
	// The requests bound what is delivered; the client's own limits
	// must never drop a message the server counts as delivered.
	if err := p.sub.SetPendingLimits(-1, -1); err != nil {
		_ = p.sub.Unsubscribe()
		return nil, fmt.Errorf("subscribe %s: %w", p.inbox, err)
	}
	p.sub.SetClosedHandler(func(string) { close(p.subDone) })
	p.status = in.nc.StatusChanged(nats.CONNECTED)
	go p.loop()
	go func() {
		<-p.done
		<-p.subDone
		in.nc.RemoveStatusListener(p.status)
		close(p.closed)
	}()
	return p, nil
}

// Stop stops pulling; messages buffered in the client are dropped
// (the server delivers them again after the ack wait).
func (p *puller) Stop() {
	p.stopped.Do(func() {
		close(p.stop)
		_ = p.sub.Unsubscribe()
	})
}

// Drain stops pulling and hands the messages already buffered in the
// client to the handler.
func (p *puller) Drain() {
	p.stopped.Do(func() {
		close(p.stop)
		if err := p.sub.Drain(); err != nil {
			_ = p.sub.Unsubscribe()
		}
	})
}

// Closed is closed once pulling stopped and the last message was
// handled.
func (p *puller) Closed() <-chan struct{} { return p.closed }

// loop sends a request, waits for it to end, and sends the next one
// PullEvery later (at once when the last one came back full), until
// Stop or Drain. Counting from the end rather than from the send, a
// request that waited for the stream's next message is followed by one
// that takes what arrived in PullEvery, not by another that waits.
func (p *puller) loop() {
	defer close(p.done)
	silence := time.NewTicker(2 * pullHeartbeat)
	defer silence.Stop()
	var heard int64
	for {
		select { // an end that came after the loop gave up on its request
		case <-p.ended:
		default:
		}
		select { // a reconnect before this request is no reason to send another
		case <-p.status:
		default:
		}
		gen := p.gen.Add(1)
		if err := p.in.nc.PublishRequest(p.subject, p.inbox+"."+strconv.FormatInt(gen, 10), p.req); err != nil {
			if errors.Is(err, nats.ErrConnectionClosed) {
				return
			}
			p.in.onConsumeError(nil, fmt.Errorf("pull request: %w", err))
			if !p.wait(retryMin) {
				return
			}
			continue
		}
		full := false
	request:
		for {
			select {
			case <-p.stop:
				return
			case <-p.subDone: // the connection was closed
				return
			case err := <-p.ended:
				if err != nil {
					if errors.Is(err, errPullFull) {
						full = true
						break request
					}
					p.in.onConsumeError(nil, err)
					if !p.wait(retryMin) {
						return
					}
				}
				break request
			case <-p.status:
				break request // reconnected: the request may be lost with the connection
			case <-silence.C:
				if h := p.heard.Load(); h != heard || h%2 == 1 {
					heard = h // something arrived, or a handler is still busy
					continue
				}
				p.in.onConsumeError(nil, jetstream.ErrNoHeartbeat)
				break request
			}
		}
		if !full && !p.wait(p.every) {
			return
		}
	}
}

// wait waits d, or returns false once stopped or the subscription
// ended.
func (p *puller) wait(d time.Duration) bool {
	if d <= 0 {
		select {
		case <-p.stop:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.stop:
		return false
	case <-p.subDone:
		return false
	case <-t.C:
		return true
	}
}

// errPullFull ends a request that delivered its batch or bytes.
var errPullFull = errors.New("pull request filled")

// receive handles one message to the inbox: a delivered message goes
// to the handler; a status (or the last message a request allowed)
// ends the request in flight.
//
// The server ends a request with a status, except when its messages
// filled its bytes exactly: the bytes are counted as the server counts
// them (Msg.Size) to see that. A status names its request by its reply
// subject; one of an earlier request (ended by its bytes, or given up
// on after a reconnect) is ignored.
func (p *puller) receive(m *nats.Msg) {
	p.heard.Add(1)
	defer p.heard.Add(1)
	gen := p.gen.Load()
	if gen != p.gotGen {
		p.gotGen, p.gotBytes = gen, 0
	}
	if len(m.Data) == 0 && len(m.Header) > 0 {
		if code := m.Header.Get(pullStatus); code != "" {
			if m.Subject == p.inbox+"."+strconv.FormatInt(gen, 10) {
				p.onStatus(code, m.Header.Get(pullDescription))
			}
			return
		}
	}
	p.handle(pulled{m})
	if p.gotBytes += m.Size(); p.gotBytes >= p.maxBytes {
		p.gotBytes = 0
		p.end(errPullFull)
	}
}

// onStatus ends the request in flight with what a status message says.
func (p *puller) onStatus(code, desc string) {
	var err error
	switch code {
	case "100": // idle heartbeat
		return
	case "404", "408": // no more messages; expired
	case "409":
		lower := strings.ToLower(desc)
		switch {
		case strings.Contains(lower, "batch completed"), strings.Contains(lower, "exceeds maxbytes"):
			err = errPullFull
		case strings.Contains(lower, "consumer deleted"):
			err = jetstream.ErrConsumerDeleted
		case strings.Contains(lower, "leadership change"):
			err = jetstream.ErrConsumerLeadershipChanged
		default:
			err = fmt.Errorf("nats: %s", desc)
		}
	case "503":
		err = nats.ErrNoResponders
	case "400":
		err = jetstream.ErrBadRequest
	default:
		err = fmt.Errorf("nats: status %s: %s", code, desc)
	}
	p.end(err)
}

// end reports the end of the request in flight to the loop.
func (p *puller) end(err error) {
	select {
	case p.ended <- err:
	default: // the loop has not taken the last one yet
	}
}

// pulled is a message delivered to the ingester's own pull requests,
// as a jetstream.Msg.
type pulled struct{ m *nats.Msg }

var _ jetstream.Msg = pulled{}

func (p pulled) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := p.m.Metadata()
	if err != nil {
		return nil, err
	}
	return &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Consumer: md.Sequence.Consumer, Stream: md.Sequence.Stream},
		NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp,
		Stream: md.Stream, Consumer: md.Consumer, Domain: md.Domain,
	}, nil
}

func (p pulled) Data() []byte         { return p.m.Data }
func (p pulled) Headers() nats.Header { return p.m.Header }
func (p pulled) Subject() string      { return p.m.Subject }
func (p pulled) Reply() string        { return p.m.Reply }
func (p pulled) Ack() error           { return p.m.Ack() }
func (p pulled) DoubleAck(ctx context.Context) error {
	return p.m.AckSync(nats.Context(ctx))
}
func (p pulled) Nak() error                             { return p.m.Nak() }
func (p pulled) NakWithDelay(delay time.Duration) error { return p.m.NakWithDelay(delay) }
func (p pulled) InProgress() error                      { return p.m.InProgress() }
func (p pulled) Term() error                            { return p.m.Term() }
func (p pulled) TermWithReason(reason string) error {
	if p.m.Reply == "" {
		return nats.ErrMsgNoReply
	}
	return p.m.Respond([]byte("+TERM " + reason))
}
