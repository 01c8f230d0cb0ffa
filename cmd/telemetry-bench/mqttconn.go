package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// paho reads a packet in three reads of the connection (the first
// byte, the remaining length, the body) and writes every packet with a
// write of its own, so over a bare TCP connection each QoS 1 PUBLISH
// and its PUBACK cost the client four system calls and the server one
// small read per packet. A device's TCP stack coalesces small writes
// (lwIP, like most embedded stacks, leaves Nagle's algorithm on); the
// load generator does the same in user space: reads are buffered, and
// writes are held for at most mqttFlushDelay or until
// mqttWriteBuffer bytes are waiting.
const (
	mqttFlushDelay  = time.Millisecond
	mqttWriteBuffer = 32 << 10
)

// bufferedMQTTConn dials addr for paho with buffered reads and
// coalesced writes.
func bufferedMQTTConn(uri *url.URL, o mqtt.ClientOptions) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", uri.Host, o.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	return &coalescingConn{Conn: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, mqttWriteBuffer)}, nil
}

// coalescingConn is a net.Conn whose reads are buffered and whose
// writes are flushed by a timer (or when the buffer fills). A failed
// flush is returned by the next Write.
type coalescingConn struct {
	net.Conn
	r *bufio.Reader

	mu      sync.Mutex
	w       *bufio.Writer
	pending bool // a flush is scheduled
	err     error
}

func (c *coalescingConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p) // flushes by itself when full
	if err != nil {
		c.err = err
		return n, err
	}
	if c.w.Buffered() > 0 && !c.pending {
		c.pending = true
		time.AfterFunc(mqttFlushDelay, c.flush)
	}
	return n, nil
}

func (c *coalescingConn) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = false
	if c.err == nil {
		c.err = c.w.Flush()
	}
}

func (c *coalescingConn) Close() error {
	c.mu.Lock()
	if c.err == nil {
		c.err = c.w.Flush()
	}
	c.mu.Unlock()
	return c.Conn.Close()
}

// mqttPublisher publishes QoS 1 PUBLISH packets on one MQTT 3.1.1
// connection with up to a window of them unacknowledged, the way a
// gateway speaking for many devices does. It encodes and decodes with
// paho's packet codec but leaves out paho's client, whose goroutine
// hand-offs, timer and in-memory store per PUBLISH cost the load
// generator more CPU per reading than the service's NATS publisher on
// the same two cores. Packets go into a buffer that is flushed when the
// window is full (before waiting for a PUBACK) or at the end; a
// goroutine of its own reads the PUBACKs.
type mqttPublisher struct {
	conn     net.Conn
	w        *bufio.Writer
	free     chan uint16   // packet identifiers not in flight
	inFlight []atomic.Bool // by packet identifier
	wait     *time.Timer
	done     chan struct{} // closed when the PUBACK reader stops
	err      error         // why it stopped; read after done is closed
}

// mqttAckWait bounds the wait for a PUBACK when the window is full.
const mqttAckWait = time.Minute

// dialMQTTPublisher connects to addr as clientID (clean session) and
// starts reading PUBACKs.
func dialMQTTPublisher(ctx context.Context, addr, clientID string, window int) (*mqttPublisher, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	if err := mqttConnect(conn, r, clientID); err != nil {
		conn.Close()
		return nil, fmt.Errorf("mqtt connect %s as %s: %w", addr, clientID, err)
	}
	p := &mqttPublisher{conn: conn, w: bufio.NewWriterSize(conn, mqttWriteBuffer), free: make(chan uint16, window),
		inFlight: make([]atomic.Bool, window+1), wait: time.NewTimer(mqttAckWait), done: make(chan struct{})}
	for id := 1; id <= window; id++ {
		p.free <- uint16(id)
	}
	go p.readAcks(r)
	return p, nil
}

// mqttConnect sends CONNECT (MQTT 3.1.1, clean session, no keepalive)
// and reads the CONNACK.
func mqttConnect(conn net.Conn, r *bufio.Reader, clientID string) error {
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return err
	}
	c := packets.NewControlPacket(packets.Connect).(*packets.ConnectPacket)
	c.ProtocolName, c.ProtocolVersion, c.CleanSession, c.ClientIdentifier = "MQTT", 4, true, clientID
	if err := c.Write(conn); err != nil {
		return err
	}
	pk, err := packets.ReadPacket(r)
	if err != nil {
		return err
	}
	ack, ok := pk.(*packets.ConnackPacket)
	switch {
	case !ok:
		return fmt.Errorf("want CONNACK, got %s", pk)
	case ack.ReturnCode != packets.Accepted:
		return fmt.Errorf("refused: %s", packets.ConnackReturnCodes[ack.ReturnCode])
	}
	return conn.SetDeadline(time.Time{})
}

// readAcks frees the packet identifier of each PUBACK until the
// connection fails or closes; a PUBACK for a packet not in flight, or
// any other packet, stops it with an error.
func (p *mqttPublisher) readAcks(r *bufio.Reader) {
	defer close(p.done)
	for {
		pk, err := packets.ReadPacket(r)
		if err != nil {
			p.err = fmt.Errorf("read PUBACK: %w", err)
			return
		}
		ack, ok := pk.(*packets.PubackPacket)
		if !ok {
			p.err = fmt.Errorf("want PUBACK, got %s", pk)
			return
		}
		id := int(ack.MessageID)
		if id < 1 || id >= len(p.inFlight) || !p.inFlight[id].CompareAndSwap(true, false) {
			p.err = fmt.Errorf("PUBACK for packet %d, which is not in flight", id)
			return
		}
		p.free <- ack.MessageID
	}
}

// publish sends payload on topic with QoS 1, waiting for a PUBACK first
// when the window is full.
func (p *mqttPublisher) publish(topic string, payload []byte) error {
	var id uint16
	select {
	case id = <-p.free:
	default:
		var err error
		if id, err = p.next(); err != nil {
			return err
		}
	}
	p.inFlight[id].Store(true)
	pk := packets.PublishPacket{FixedHeader: packets.FixedHeader{MessageType: packets.Publish, Qos: 1},
		TopicName: topic, MessageID: id, Payload: payload}
	return pk.Write(p.w)
}

// next flushes what is buffered and waits for a packet identifier to
// come free.
func (p *mqttPublisher) next() (uint16, error) {
	if err := p.w.Flush(); err != nil {
		return 0, err
	}
	p.wait.Reset(mqttAckWait)
	defer p.wait.Stop()
	select {
	case id := <-p.free:
		return id, nil
	case <-p.done:
		return 0, p.err
	case <-p.wait.C:
		return 0, fmt.Errorf("no PUBACK within %s", mqttAckWait)
	}
}

// close waits for every PUBLISH in flight to be acknowledged (it holds
// every packet identifier then), then disconnects. It returns the first
// failure.
func (p *mqttPublisher) close() error {
	err := p.w.Flush()
	for held := 0; err == nil && held < cap(p.free); held++ {
		_, err = p.next()
	}
	if err == nil {
		err = packets.NewControlPacket(packets.Disconnect).Write(p.conn)
	}
	if cerr := p.conn.Close(); err == nil {
		err = cerr
	}
	<-p.done
	return err
}
