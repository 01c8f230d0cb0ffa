package natsembed

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// startTestServer runs a server with the MQTT listener on free ports
// and the service's connection to it, MQTT set up.
func startTestServer(t *testing.T) (*Server, *nats.Conn) {
	t.Helper()
	srv, err := Start(Config{Listen: "127.0.0.1:0", MQTTListen: "127.0.0.1:0", StoreDir: filepath.Join(t.TempDir(), "nats")})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL(), srv.ClientOptions()...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, srv.StartMQTT(ctx, nc, ingest.DefaultConfig()))
	t.Cleanup(srv.StopMQTT)
	return srv, nc
}

// TestClientsLandInTheirAccounts: the server tells MQTT clients from
// NATS clients by its connection info, puts the MQTT ones in the MQTT
// account and the NATS ones in the service's; the service's MQTT
// connection needs its secret.
func TestClientsLandInTheirAccounts(t *testing.T) {
	srv, _ := startTestServer(t)
	mc := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + srv.MQTTAddr()).SetClientID("dev-1").
		SetProtocolVersion(4).SetConnectTimeout(10 * time.Second))
	tok := mc.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	t.Cleanup(func() { mc.Disconnect(0) })
	nc, err := nats.Connect(srv.ClientURL(), nats.Name("a-nats-client"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	// A bare NATS client that names no library is told apart by the
	// server's connection info.
	raw, err := net.Dial("tcp", strings.TrimPrefix(srv.ClientURL(), "nats://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	_, err = raw.Write([]byte("CONNECT {\"verbose\":false,\"name\":\"bare\"}\r\nPING\r\n"))
	require.NoError(t, err)
	r := bufio.NewReader(raw)
	for {
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		if strings.HasPrefix(line, "PONG") {
			break
		}
		require.False(t, strings.HasPrefix(line, "-ERR"), line)
	}

	accountOf := map[string]string{}
	for _, acc := range []string{MQTTAccount, server.DEFAULT_GLOBAL_ACCOUNT} {
		cz, err := srv.NATS().Connz(&server.ConnzOptions{Account: acc})
		require.NoError(t, err)
		for _, ci := range cz.Conns {
			accountOf[ci.Name+ci.MQTTClient] = acc
		}
	}
	assert.Equal(t, MQTTAccount, accountOf["dev-1"], "the MQTT client")
	assert.Equal(t, server.DEFAULT_GLOBAL_ACCOUNT, accountOf["a-nats-client"], "the NATS client")
	assert.Equal(t, server.DEFAULT_GLOBAL_ACCOUNT, accountOf["bare"], "the bare NATS client")

	_, err = nats.Connect(srv.ClientURL(), nats.UserInfo(MQTTAdminUser, "not-its-secret"), nats.MaxReconnects(0))
	assert.Error(t, err, "the MQTT account's service user needs its secret")
}

// TestMQTTPublishIsStoredAsTheDeviceSubject: a QoS 1 publish on
// telemetry/dev-1 is kept by the telemetry stream as telemetry.dev-1
// (the transform package topology names).
func TestMQTTPublishIsStoredAsTheDeviceSubject(t *testing.T) {
	srv, nc := startTestServer(t)
	mc := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + srv.MQTTAddr()).SetClientID("pub").SetProtocolVersion(4))
	tok := mc.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	t.Cleanup(func() { mc.Disconnect(0) })
	tok = mc.Publish("telemetry/dev-1", 1, false, `{"t":1}`)
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())

	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, ingest.DefaultConfig().Stream)
	require.NoError(t, err)
	subjects := topology.For("telemetry")
	assert.Equal(t, subjects.MQTTCopiesTransform(), *st.CachedInfo().Config.SubjectTransform)
	m, err := st.GetLastMsgForSubject(ctx, subjects.Device("dev-1"))
	require.NoError(t, err)
	assert.Equal(t, `{"t":1}`, string(m.Data))
}
