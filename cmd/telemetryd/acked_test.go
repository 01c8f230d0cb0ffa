package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/bucketstest"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/ingest/lineproto"
	"github.com/telemetryd/telemetryd/ingest/natsembed"
)

// Tests of "acked means stored, whatever any other client does" at the
// service's doors: NATS, MQTT QoS 1 and 2, line protocol.

// mqttDevice connects a paho MQTT 3.1.1 client to addr as user (no
// user: anonymous); lost, when given, receives connection losses.
func mqttDevice(t *testing.T, addr, id, user, pass string, lost chan<- error) mqtt.Client {
	t.Helper()
	opts := mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).
		SetConnectTimeout(5 * time.Second).SetWriteTimeout(5 * time.Second)
	if user != "" {
		opts.SetUsername(user).SetPassword(pass)
	}
	if lost != nil {
		opts.SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			select {
			case lost <- err:
			default:
			}
		})
	}
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second), "connect timed out")
	require.NoError(t, tok.Error())
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

// reading is a JSON reading of n at testEpoch + n seconds.
func reading(n int) string {
	return fmt.Sprintf(`{"ts":%q,"n":%d}`, testEpoch.Add(time.Duration(n)*time.Second).Format(time.RFC3339Nano), n)
}

// TestNoDeviceSuppressesAnothersMessages: another client publishes
// first, on its own subject, with the message ID that a device's next
// message carries (MQTT QoS 2: q2-<n>; QoS 1; line protocol: lp- and a
// hash of subject and body; firmware: 1, 2, 3); every message of the
// device is stored.
func TestNoDeviceSuppressesAnothersMessages(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	squat := func(id string) {
		t.Helper()
		m := nats.NewMsg("telemetry.squatter")
		m.Data = []byte(reading(0))
		m.Header.Set(jetstream.MsgIDHeader, id)
		_, err := s.js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	const n = 30
	for i := 1; i <= 2*n+5; i++ {
		squat(fmt.Sprintf("q2-%d", i))
		squat(fmt.Sprint(i))
	}

	t.Run("MQTT QoS 1 and 2", func(t *testing.T) {
		for _, qos := range []byte{1, 2} {
			c := mqttDevice(t, s.MQTTAddr(), fmt.Sprintf("q%d", qos), "", "", nil)
			for i := range n {
				tok := c.Publish(fmt.Sprintf("telemetry/mqtt-q%d", qos), qos, false, reading(i))
				require.True(t, tok.WaitTimeout(10*time.Second))
				require.NoError(t, tok.Error())
			}
		}
		waitStored(t, s, "mqtt-q1", n)
		waitStored(t, s, "mqtt-q2", n)
	})

	t.Run("NATS firmware numbering its messages", func(t *testing.T) {
		for i := 1; i <= n; i++ {
			m := nats.NewMsg("telemetry.firmware")
			m.Data = []byte(reading(i))
			m.Header.Set(jetstream.MsgIDHeader, fmt.Sprint(i))
			ack, err := s.js.PublishMsg(ctx, m)
			require.NoError(t, err)
			require.False(t, ack.Duplicate, "message %d acked as a duplicate", i)
		}
		waitStored(t, s, "firmware", n)
	})

	t.Run("line protocol", func(t *testing.T) {
		body := fmt.Sprintf("m,device=lp-dev v=1 %d\n", testEpoch.UnixNano())
		res := lineproto.Map([]byte(body), linemsg.Options{DeviceTags: []string{"device", "host"},
			Precision: time.Nanosecond, Now: testEpoch, Window: buckets.DefaultWindow})
		require.Len(t, res.Messages, 1)
		squat(res.Messages[0].MsgID)
		code, resp := s.post(t, "/api/v2/write", []byte(body), nil)
		require.Equal(t, 204, code, resp)
		waitStored(t, s, "lp-dev", 1)
	})
}

// TestAuthReloadKeepsTheServiceConnections: a change of the auth file
// disconnects removed devices only, never the service's own
// connections (the main one, the line protocol writes', the MQTT
// forwarder's), so QoS 0 readings keep flowing.
func TestAuthReloadKeepsTheServiceConnections(t *testing.T) {
	inLane(t, lanes.general)
	m, f := newAuthService(t)
	base := "http://" + m.HTTPAddr()
	c := mqttDevice(t, m.MQTTAddr(), "dev-1", "dev-1", f.devices["dev-1"], nil)
	require.True(t, c.Publish("telemetry/dev-1", 0, false, reading(1)).WaitTimeout(10*time.Second))
	waitFor(t, 20*time.Millisecond, func() bool { return latestCount(t, base, "dev-1", f.tokens["all"]) == 1 })

	own := map[string]*nats.Conn{"main": m.nc, "writes": m.writesNC, "mqtt forwarder": m.nats.MQTTForwarder()}
	authCLI(t, f.path, "add-device", "dev-3")
	authCLI(t, f.path, "revoke", "dev-2")
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	waitFor(t, 20*time.Millisecond, func() bool {
		_, _, err := deviceConn(m.NATSURL(), "dev-2", f.devices["dev-2"], nats.MaxReconnects(0))
		return err != nil
	}, "the auth file was not reloaded")
	// Disconnects after a reload are immediate; give them a moment.
	time.Sleep(200 * time.Millisecond)
	for name, nc := range own {
		assert.Zero(t, nc.Stats().Reconnects, "the service's %s connection was dropped by the reload", name)
	}
	require.True(t, c.Publish("telemetry/dev-1", 0, false, reading(2)).WaitTimeout(10*time.Second))
	waitFor(t, 20*time.Millisecond, func() bool { return latestCount(t, base, "dev-1", f.tokens["all"]) == 2 },
		"a QoS 0 reading after the reload is stored")
}

// TestMQTTStreamsAreBounded: every $MQTT_* stream is bounded in bytes
// and refuses new messages when full.
func TestMQTTStreamsAreBounded(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.MQTTStreamMaxBytes = 3 << 20
	s := startService(t, cfg)
	mqttDevice(t, s.MQTTAddr(), "first", "", "", nil) // the server sets its streams up now
	js, err := jetstream.New(s.nats.MQTTForwarder())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := js.StreamNames(ctx)
	var seen []string
	for name := range names.Name() {
		seen = append(seen, name)
		st, err := js.Stream(ctx, name)
		require.NoError(t, err)
		c := st.CachedInfo().Config
		assert.Equal(t, int64(3<<20), c.MaxBytes, "stream %s", name)
		assert.Equal(t, jetstream.DiscardNew, c.Discard, "stream %s", name)
	}
	require.NoError(t, names.Err())
	assert.ElementsMatch(t, []string{"$MQTT_sess", "$MQTT_msgs", "$MQTT_qos2in", "$MQTT_out", "$MQTT_rmsgs"}, seen)

	// The readings stream and its dead letters, in the service's account.
	for _, name := range []string{streamOf("first"), "TELEMETRY_REJECTED", "TELEMETRY_NODEDUP"} {
		st, err := s.js.Stream(ctx, name)
		require.NoError(t, err)
		assert.Positive(t, st.CachedInfo().Config.MaxBytes, "stream %s", name)
	}
}

// TestMQTTQoS2WithoutPubRelIsBounded: a client that sends QoS 2
// PUBLISHes and never the PUBREL fills $MQTT_qos2in up to its bound and
// is then refused (its connection closed); the stream stays bounded.
func TestMQTTQoS2WithoutPubRelIsBounded(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.MQTTStreamMaxBytes = 2 << 20
	s := startService(t, cfg)
	conn, err := net.Dial("tcp", s.MQTTAddr())
	require.NoError(t, err)
	defer conn.Close()
	cp := packets.NewControlPacket(packets.Connect).(*packets.ConnectPacket)
	cp.ProtocolName, cp.ProtocolVersion, cp.ClientIdentifier, cp.CleanSession, cp.Keepalive = "MQTT", 4, "hoarder", true, 60
	require.NoError(t, cp.Write(conn))
	ack, err := packets.ReadPacket(conn)
	require.NoError(t, err)
	require.IsType(t, &packets.ConnackPacket{}, ack)

	var mu sync.Mutex
	var pubrecs int
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for {
			p, err := packets.ReadPacket(conn)
			if err != nil {
				return
			}
			if _, ok := p.(*packets.PubrecPacket); ok {
				mu.Lock()
				pubrecs++
				mu.Unlock()
			}
		}
	}()
	payload := bytes.Repeat([]byte("x"), 256<<10)
	const sent = 24 // 6 MiB, three times the bound
	for i := 1; i <= sent; i++ {
		p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
		p.Qos, p.TopicName, p.MessageID, p.Payload = 2, "telemetry/hoarder", uint16(i), payload
		if p.Write(conn) != nil {
			break // closed by the server
		}
	}
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the server kept the connection of a client past the bound")
	}
	js, err := jetstream.New(s.nats.MQTTForwarder())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, natsembed.MQTTQoS2InStream)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	assert.LessOrEqual(t, info.State.Bytes, uint64(2<<20), "held QoS 2 messages stay within the bound")
	mu.Lock()
	defer mu.Unlock()
	assert.Less(t, pubrecs, sent, "a PUBREC for a PUBLISH that could not be held")
}

// openLoggedService opens a service whose log is also kept in the
// returned buffer.
func openLoggedService(t *testing.T, cfg Config) (*Main, *bucketstest.SyncBuffer) {
	t.Helper()
	logs := &bucketstest.SyncBuffer{}
	return openMain(t, cfg, io.MultiWriter(testLogWriter(t), logs), testClock()), logs
}

// TestMQTTQoS1OutsideItsTopicClosesTheConnection: a device's QoS 1
// publish on a topic it may not use (with an auth file: another
// device's; without: outside <prefix>/<device>) stores nothing and
// closes the connection, and is logged as the client's mistake (WARN),
// not as the service's failure (ERROR). With an auth file the server
// has acknowledged the publish before the close (MQTT 3.1.1 has no
// refusal; the server acks and drops, as the protocol allows).
func TestMQTTQoS1OutsideItsTopicClosesTheConnection(t *testing.T) {
	inLane(t, lanes.general)
	f := newAuthFixture(t, []string{"dev-1", "dev-2"}, "all:read")
	for _, tc := range []struct {
		name, topic string
		auth        bool
	}{
		{"another device's topic", "telemetry/dev-2", true},
		{"outside the prefix, with auth", "elsewhere/dev-1", true},
		{"outside the prefix, without auth", "elsewhere/dev-1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newTestConfig(t)
			cfg.LogLevel = "info"
			user, pass := "", ""
			if tc.auth {
				cfg.Security.AuthFile = f.path
				user, pass = "dev-1", f.devices["dev-1"]
			}
			m, logs := openLoggedService(t, cfg)
			lost := make(chan error, 1)
			c := mqttDevice(t, m.MQTTAddr(), "dev-1", user, pass, lost)
			start := time.Now()
			tok := c.Publish(tc.topic, 1, false, reading(1))
			select {
			case err := <-lost:
				t.Logf("connection closed after %s: %v", time.Since(start), err)
			case <-time.After(15 * time.Second):
				t.Fatal("the connection stays open")
			}
			if !tc.auth {
				assert.False(t, tok.WaitTimeout(time.Second) && tok.Error() == nil, "acknowledged, though nothing can store it")
			}
			token := ""
			if tc.auth {
				token = f.tokens["all"]
			}
			assert.Equal(t, 0, latestCount(t, "http://"+m.HTTPAddr(), "dev-2", token))
			assert.NotContains(t, logs.String(), "level=ERROR")
		})
	}
}

// TestMQTTFullStreamRefusesAndKeepsWhatItAcked: while the service does
// not consume (its disk reserve is never met), an MQTT device fills the
// readings stream with QoS 1 publishes. The publish past the bound gets
// no PUBACK and its connection is closed; every PUBACKed one is still
// in the stream.
func TestMQTTFullStreamRefusesAndKeepsWhatItAcked(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.StreamMaxBytes, cfg.DiskReserve = 1<<20, 1<<60
	m, _ := openLoggedService(t, cfg)
	lost := make(chan error, 1)
	c := mqttDevice(t, m.MQTTAddr(), "filler", "", "", lost)
	pad := string(bytes.Repeat([]byte("x"), 64<<10))
	acked := 0
	for i := range 64 { // 4 MiB, four times the bound
		tok := c.Publish("telemetry/filler", 1, false, fmt.Sprintf(`{"ts":%q,"pad":%q}`,
			testEpoch.Add(time.Duration(i)*time.Second).Format(time.RFC3339Nano), pad))
		if !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
			break
		}
		acked++
	}
	select {
	case err := <-lost:
		t.Logf("refused after %d PUBACKs: %v", acked, err)
	case <-time.After(15 * time.Second):
		t.Fatalf("all %d publishes acknowledged: the full stream did not refuse", acked)
	}
	require.Positive(t, acked)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := nats.Connect(m.NATSURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := js.Stream(ctx, streamOf("filler"))
	require.NoError(t, err)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(storedSubject("filler")))
	require.NoError(t, err)
	assert.Equal(t, uint64(acked), info.State.Subjects[storedSubject("filler")], "every PUBACKed publish is in the stream")
	assert.Equal(t, uint64(1), info.State.FirstSeq, "nothing was removed to make room")
}
