package main

import (
	"bufio"
	"io"
	"net"
	"net/url"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCoalescingConnDeliversEveryWriteInOrder: small writes reach the
// peer in order, in fewer reads than writes, without waiting for more
// writes (the flush timer) or for Close; reads come through the buffer.
func TestCoalescingConnDeliversEveryWriteInOrder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	o := mqtt.NewClientOptions()
	o.ConnectTimeout = 5 * time.Second
	c, err := bufferedMQTTConn(&url.URL{Scheme: "tcp", Host: ln.Addr().String()}, *o)
	require.NoError(t, err)
	defer c.Close()
	peer := <-accepted
	defer peer.Close()

	const packets = 200
	var want []byte
	for i := range packets {
		p := []byte{byte(i), byte(i >> 8), 0xAB}
		want = append(want, p...)
		n, err := c.Write(p)
		require.NoError(t, err)
		require.Equal(t, len(p), n)
	}
	require.NoError(t, peer.SetReadDeadline(time.Now().Add(5*time.Second)))
	got := make([]byte, 0, len(want))
	reads := 0
	buf := make([]byte, 64<<10)
	for len(got) < len(want) {
		n, err := peer.Read(buf)
		require.NoError(t, err, "the writes were not flushed without Close")
		got = append(got, buf[:n]...)
		reads++
	}
	assert.Equal(t, want, got)
	assert.Less(t, reads, packets, "the writes were not coalesced")

	// The other direction: the reply is read through the buffer.
	_, err = peer.Write([]byte("\x40\x02\x00\x01"))
	require.NoError(t, err)
	ack := make([]byte, 4)
	_, err = io.ReadFull(bufio.NewReader(c), ack)
	require.NoError(t, err)
	assert.Equal(t, []byte("\x40\x02\x00\x01"), ack)

	// Close flushes what is still buffered.
	_, err = c.Write([]byte("last"))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	rest, err := io.ReadAll(peer)
	require.NoError(t, err)
	assert.Equal(t, "last", string(rest))
}
