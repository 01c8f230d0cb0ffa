package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/natsembed"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// newMQTTClient connects a paho MQTT 3.1.1 client to the service.
func newMQTTClient(t *testing.T, s *testService, id string) mqtt.Client {
	t.Helper()
	require.NotEmpty(t, s.MQTTAddr(), "MQTT listener not running")
	opts := mqtt.NewClientOptions().
		AddBroker("tcp://" + s.MQTTAddr()).
		SetClientID(id).
		SetProtocolVersion(4). // 3.1.1
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectTimeout(5 * time.Second)
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second), "connect timed out")
	require.NoError(t, tok.Error())
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

// mqttBatch is a JSON batch of n readings of device starting at first
// (one per second), each with its sequence number.
func mqttBatch(first time.Time, seq0, n int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"ts":%q,"seq":%d,"temp":%d.25}`,
			first.Add(time.Duration(seq0+i)*time.Second).Format(time.RFC3339Nano), seq0+i, seq0+i)
	}
	b.WriteByte(']')
	return b.String()
}

func TestMQTTStoresExactlyWhatWasPublished(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	const devices, messages, batch = 12, 10, 5
	first := testEpoch.Add(-time.Hour)
	var wg sync.WaitGroup
	for qos := byte(0); qos <= 1; qos++ {
		c := newMQTTClient(t, s, fmt.Sprintf("test-qos%d", qos))
		for d := range devices {
			device := fmt.Sprintf("mqtt-q%d-%02d", qos, d)
			wg.Go(func() {
				var toks []mqtt.Token
				for m := range messages {
					toks = append(toks, c.Publish("telemetry/"+device, qos, false, mqttBatch(first, m*batch, batch)))
				}
				for _, tok := range toks {
					if assert.True(t, tok.WaitTimeout(10*time.Second)) {
						assert.NoError(t, tok.Error())
					}
				}
			})
		}
	}
	wg.Wait()
	for qos := 0; qos <= 1; qos++ {
		for d := range devices {
			device := fmt.Sprintf("mqtt-q%d-%02d", qos, d)
			waitStored(t, s, device, messages*batch)
			rs := pageAll(t, s, device, "asc", 1000, url.Values{})
			require.Len(t, rs, messages*batch)
			for i, r := range rs {
				assert.Equal(t, first.Add(time.Duration(i)*time.Second).Format(time.RFC3339Nano), r.TS)
				assert.Equal(t, map[string]any{"seq": float64(i), "temp": float64(i) + 0.25}, r.Values)
			}
		}
	}
}

// TestMQTTPubAckFollowsTheStoredMessage checks that once a QoS 1
// publish is acknowledged, the telemetry stream already holds it, and
// holds it once: the MQTT connection is in the MQTT account, whose store
// copy is the message the stream keeps.
func TestMQTTPubAckFollowsTheStoredMessage(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	c := newMQTTClient(t, s, "ack-order")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, streamOf("acked"))
	require.NoError(t, err)
	part := strconv.Itoa(partition.Of(DefaultStreamPartitions, "acked"))
	// The stream captures the intake's subjects (devices' NATS
	// publishes are answered by the service) and the MQTT store copies.
	assert.Equal(t, []string{"$TELEMETRYD.in.telemetry." + part + ".*", "$MQTT.msgs.telemetry." + part + ".*"}, st.CachedInfo().Config.Subjects)
	const n = 200
	for i := range n {
		payload := fmt.Sprintf(`{"ts":%q,"n":%d}`, testEpoch.Add(time.Duration(i)*time.Millisecond).Format(time.RFC3339Nano), i)
		tok := c.Publish("telemetry/acked", 1, false, payload)
		require.True(t, tok.WaitTimeout(10*time.Second))
		require.NoError(t, tok.Error())
		m, err := st.GetLastMsgForSubject(ctx, storedSubject("acked"))
		require.NoError(t, err, "publish %d acknowledged but not in the stream", i)
		require.Equal(t, payload, string(m.Data), "publish %d acknowledged before it was stored", i)
		require.Equal(t, "1", m.Header.Get(natsembed.MQTTQoSHeader))
	}
	waitStored(t, s, "acked", n)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(n), info.State.Msgs, "one stored message per QoS 1 PUBLISH")

	cz, err := s.nats.NATS().Connz(&server.ConnzOptions{Account: natsembed.MQTTAccount})
	require.NoError(t, err)
	var mqttConns int
	for _, ci := range cz.Conns {
		if ci.MQTTClient == "ack-order" {
			mqttConns++
		}
	}
	assert.Equal(t, 1, mqttConns, "the MQTT client is in account %s", natsembed.MQTTAccount)
	ms, err := s.js.Stream(ctx, natsembed.MQTTMsgsStream)
	assert.ErrorIs(t, err, jetstream.ErrStreamNotFound, "no MQTT stream in the service's account: %v", ms)
}

func TestMQTTBadPayloadGoesToDeadLetters(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	sub, err := s.nc.SubscribeSync("rejected.telemetry.>")
	require.NoError(t, err)
	require.NoError(t, s.nc.Flush())
	c := newMQTTClient(t, s, "bad-payload")
	bad := fmt.Sprintf(`{"ts":%q,"temp":null}`, testEpoch.Format(time.RFC3339Nano))
	tok := c.Publish("telemetry/mqtt-bad", 1, false, bad)
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	msg, err := sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "rejected.telemetry.mqtt-bad", msg.Subject)
	assert.Equal(t, bad, string(msg.Data))
	assert.Equal(t, string(buckets.CodeInvalidValue), msg.Header.Get("Telemetry-Error-Code"))
	assert.Contains(t, msg.Header.Get("Telemetry-Error"), "temp")

	good := fmt.Sprintf(`{"ts":%q,"temp":1.5}`, testEpoch.Format(time.RFC3339Nano))
	require.True(t, c.Publish("telemetry/mqtt-bad", 1, false, good).WaitTimeout(10*time.Second))
	waitStored(t, s, "mqtt-bad", 1)
}

// TestMQTTQoS0IsForwarded: a QoS 0 publish has no store copy; the
// forwarder puts it in the telemetry stream, once.
func TestMQTTQoS0IsForwarded(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	c := newMQTTClient(t, s, "qos0")
	const n = 50
	for i := range n {
		payload := fmt.Sprintf(`{"ts":%q,"n":%d}`, testEpoch.Add(time.Duration(i)*time.Second).Format(time.RFC3339Nano), i)
		require.True(t, c.Publish("telemetry/zero", 0, false, payload).WaitTimeout(10*time.Second))
	}
	waitStored(t, s, "zero", n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, streamOf("zero"))
	require.NoError(t, err)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(">"))
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{storedSubject("zero"): n}, info.State.Subjects)
}

func TestMQTTOff(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.MQTTListen = ""
	s := startService(t, cfg)
	assert.Empty(t, s.MQTTAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for p := range DefaultStreamPartitions {
		st, err := s.js.Stream(ctx, partition.Stream("TELEMETRY", p))
		require.NoError(t, err)
		assert.Equal(t, []string{ingest.IntakeSubject("telemetry", p, "*")}, st.CachedInfo().Config.Subjects)
	}
}

// TestMosquittoPub publishes one reading with Debian's mosquitto_pub.
func TestMosquittoPub(t *testing.T) {
	inLane(t, lanes.general)
	bin, err := exec.LookPath("mosquitto_pub")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("mosquitto_pub not installed; .ci/run installs mosquitto-clients")
		}
		t.Skip("mosquitto_pub not installed (apt-get install mosquitto-clients)")
	}
	s := startService(t, newTestConfig(t))
	host, port, _ := strings.Cut(s.MQTTAddr(), ":")
	payload := fmt.Sprintf(`{"ts":%q,"temp":21.5,"door":"open"}`, testEpoch.Format(time.RFC3339Nano))
	out, err := exec.Command(bin, "-h", host, "-p", port, "-V", "mqttv311", "-q", "1",
		"-t", "telemetry/mosq-1", "-m", payload).CombinedOutput()
	require.NoError(t, err, "%s", out)
	waitStored(t, s, "mosq-1", 1)
	var r apiReading
	code, body := s.get(t, "/v1/devices/mosq-1/readings/"+testEpoch.Format(time.RFC3339Nano), &r)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, map[string]any{"temp": 21.5, "door": "open"}, r.Values)
}

// TestMQTTOtherTopicsStoreNothing: a publish outside <prefix>/<device>
// is not stored; with QoS 1 nothing can persist it, so it is never
// acknowledged and the connection is closed.
func TestMQTTOtherTopicsStoreNothing(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	c := newMQTTClient(t, s, "stray")
	tok := c.Publish("elsewhere/dev-1", 1, false, `{"temp":1}`)
	require.True(t, tok.WaitTimeout(15*time.Second), "no answer at all")
	assert.Error(t, tok.Error(), "a QoS 1 publish nothing stores must not be acknowledged")
	assert.False(t, c.IsConnectionOpen())
	var l apiList
	code, body := s.get(t, "/v1/devices/dev-1/readings/latest", &l)
	require.Equal(t, http.StatusOK, code, body)
	assert.Empty(t, l.Readings)
}
