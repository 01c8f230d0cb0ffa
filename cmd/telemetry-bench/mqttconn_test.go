package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/url"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
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

// TestMQTTPublisherStoresEveryMessageOnce publishes a workload through a
// NATS server's MQTT listener into a stream: every message arrives once,
// on its device's subject, with its payload, and every PUBACK came back
// (the publishers close with their windows full of free identifiers).
func TestMQTTPublisherStoresEveryMessageOnce(t *testing.T) {
	_, st, addr := ingesttest.RunMQTT(t, "bench-mqtt-test")
	ctx := testContext(t)

	// More messages than the windows (4 x 512) hold, so that publishers
	// wait for PUBACKs and reuse packet identifiers.
	w := newWorkload(deviceIDs(37), 5000, 1, time.Second, time.Now().Add(-time.Minute))
	_, err := publishMQTT(ctx, addr, w)
	require.NoError(t, err)

	want := map[string]int{}
	for m := range w.msgs {
		want[w.subject(m)+" "+string(w.payload(nil, m))]++
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	got := map[string]int{}
	for range w.msgs {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		require.NoError(t, err)
		got[msg.Subject()+" "+string(msg.Data())]++
	}
	assert.Equal(t, want, got)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(w.msgs), info.State.Msgs, "nothing published twice")
}

// TestMQTTPublisherRejectsStrayPUBACK: a PUBACK for a packet identifier
// that is not in flight ends the publisher with an error naming it.
func TestMQTTPublisherRejectsStrayPUBACK(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		if _, err := packets.ReadPacket(r); err != nil { // CONNECT
			return
		}
		ack := packets.NewControlPacket(packets.Connack).(*packets.ConnackPacket)
		if ack.Write(c) != nil {
			return
		}
		if _, err := packets.ReadPacket(r); err != nil { // the PUBLISH, packet 1
			return
		}
		stray := packets.NewControlPacket(packets.Puback).(*packets.PubackPacket)
		stray.MessageID = 7
		_ = stray.Write(c)
		_, _ = io.Copy(io.Discard, r)
	}()
	p, err := dialMQTTPublisher(context.Background(), ln.Addr().String(), "stray", 2)
	require.NoError(t, err)
	require.NoError(t, p.publish("telemetry/dev-1", []byte(`{}`)))
	err = p.close()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PUBACK for packet 7, which is not in flight")
}
