package main

import (
	"bufio"
	"net"
	"net/url"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
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
