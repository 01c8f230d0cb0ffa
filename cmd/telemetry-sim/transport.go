package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// lineMeasurement is the measurement of simulated line protocol: values
// arrive as sim.temp, sim.humidity, ...
const lineMeasurement = "sim"

// encode appends the payload of readings of device: JSON, or line
// protocol (one line per reading, nanosecond timestamps) with -protocol
// line.
func (f *fleet) encode(dst []byte, device string, rs []reading) []byte {
	if !f.line {
		return appendPayload(dst, f.pf, f.names, rs)
	}
	for _, r := range rs {
		dst = append(dst, lineMeasurement+",device="...)
		dst = append(dst, device...)
		dst = append(dst, ' ')
		for i, v := range r.vals {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, f.names[i]...)
			dst = append(dst, '=')
			dst = appendNumber(dst, v)
		}
		dst = append(dst, ' ')
		dst = strconv.AppendInt(dst, r.us*1000, 10)
		dst = append(dst, '\n')
	}
	return dst
}

// future is a jetstream.PubAckFuture resolved by a transport other than
// JetStream: an MQTT PUBACK, or a 204 from the write endpoint.
type future struct {
	msg *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error
}

func newFuture(m *nats.Msg) *future {
	return &future{msg: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
}

func (f *future) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *future) Err() <-chan error            { return f.err }
func (f *future) Msg() *nats.Msg               { return f.msg }

func (f *future) resolve(err error) {
	if err != nil {
		f.err <- err
		return
	}
	f.ok <- &jetstream.PubAck{}
}

// mqttTransport publishes each message on topic <prefix>/<device>.
type mqttTransport struct {
	clients []mqtt.Client
	qos     byte
}

var _ asyncPublisher = (*mqttTransport)(nil)

func newMQTTTransport(cfg config) (*mqttTransport, error) {
	t := &mqttTransport{qos: byte(cfg.MQTTQoS)}
	for i := range cfg.MQTTClients {
		opts := mqtt.NewClientOptions().AddBroker(cfg.MQTTURL).
			SetClientID(fmt.Sprintf("telemetry-sim-%d-%d", time.Now().UnixNano()%1e6, i)).
			SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(true).
			SetConnectTimeout(10 * time.Second).SetWriteTimeout(ackTimeout)
		c := mqtt.NewClient(opts)
		tok := c.Connect()
		if !tok.WaitTimeout(15 * time.Second) {
			t.close()
			return nil, fmt.Errorf("mqtt connect %s: timed out", cfg.MQTTURL)
		}
		if err := tok.Error(); err != nil {
			t.close()
			return nil, fmt.Errorf("mqtt connect %s: %w", cfg.MQTTURL, err)
		}
		t.clients = append(t.clients, c)
	}
	return t, nil
}

// PublishMsgAsync publishes m; the future resolves on the PUBACK (QoS
// 1) or once the packet is written (QoS 0).
func (t *mqttTransport) PublishMsgAsync(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	h := fnv.New32a()
	h.Write([]byte(m.Subject))
	c := t.clients[int(h.Sum32())%len(t.clients)]
	tok := c.Publish(strings.ReplaceAll(m.Subject, ".", "/"), t.qos, false, m.Data)
	f := newFuture(m)
	go func() {
		if !tok.WaitTimeout(ackTimeout) {
			f.resolve(errors.New("mqtt: no PUBACK in time"))
			return
		}
		f.resolve(tok.Error())
	}()
	return f, nil
}

func (t *mqttTransport) close() {
	for _, c := range t.clients {
		c.Disconnect(250)
	}
}

// lineTransport posts each message, a block of line protocol, to
// /api/v2/write with at most LineWriters requests at once.
type lineTransport struct {
	url    string
	token  string
	client *http.Client
	slots  chan struct{}
}

var _ asyncPublisher = (*lineTransport)(nil)

func newLineTransport(cfg config) *lineTransport {
	return &lineTransport{
		url:    strings.TrimSuffix(cfg.HTTPURL, "/") + "/api/v2/write?bucket=sim&precision=ns",
		token:  cfg.Token,
		client: &http.Client{Timeout: ackTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.LineWriters}},
		slots:  make(chan struct{}, cfg.LineWriters),
	}
}

// PublishMsgAsync posts m.Data; the future resolves on the answer: 204
// is an ack, anything else an error naming the status and body.
func (t *lineTransport) PublishMsgAsync(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	f := newFuture(m)
	t.slots <- struct{}{}
	go func() {
		defer func() { <-t.slots }()
		f.resolve(t.post(m.Data))
	}()
	return f, nil
}

func (t *lineTransport) post(body []byte) error {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, t.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	if t.token != "" {
		req.Header.Set("Authorization", "Token "+t.token)
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return fmt.Errorf("line protocol write: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("line protocol write: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
