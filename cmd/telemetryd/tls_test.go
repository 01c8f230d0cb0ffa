package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
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

	"github.com/telemetryd/telemetryd/ingest/natsembed"
)

// testCert writes a self-signed certificate for 127.0.0.1 and
// localhost and returns the cert and key paths and a pool trusting it.
func testCert(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "telemetryd test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kb, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600))
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestTLSEverywhere(t *testing.T) {
	inLane(t, lanes.general)
	certFile, keyFile, pool := testCert(t)
	m, f := newAuthService(t, func(c *Config) {
		c.Security.TLSCert, c.Security.TLSKey = certFile, keyFile
		c.MQTTListen = "127.0.0.1:0"
	})
	tlsClient := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	https := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsClient}, Timeout: 10 * time.Second}
	ts := m.now().UTC()

	t.Run("HTTPS", func(t *testing.T) {
		code, body := httpDo(t, https, http.MethodGet, "https://"+m.HTTPAddr()+"/v1/tables", f.tokens["all"])
		assert.Equal(t, http.StatusOK, code, body)
		resp, err := http.Get("http://" + m.HTTPAddr() + "/healthz")
		if err == nil {
			resp.Body.Close()
			assert.NotEqual(t, http.StatusOK, resp.StatusCode, "plain HTTP to the HTTPS listener")
		}
	})

	t.Run("NATS TLS", func(t *testing.T) {
		url := m.NATSURL()
		require.Contains(t, url, "tls://")
		nc, _, err := deviceConn(url, "dev-1", f.devices["dev-1"], nats.Secure(tlsClient))
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		_, err = js.Publish(t.Context(), "telemetry.dev-1", fmt.Appendf(nil, `{"ts":%q,"temp":1}`, ts.Format(time.RFC3339Nano)))
		require.NoError(t, err)
		_, _, err = deviceConn("nats://"+nc.ConnectedAddr(), "dev-1", f.devices["dev-1"], nats.MaxReconnects(0))
		require.Error(t, err, "a plain connection to the TLS listener fails")
	})

	t.Run("MQTT over TLS (paho)", func(t *testing.T) {
		require.NotEmpty(t, m.MQTTAddr())
		connect := func(broker string, tc *tls.Config) error {
			opts := mqtt.NewClientOptions().AddBroker(broker).SetClientID("dev-2").SetUsername("dev-2").
				SetPassword(f.devices["dev-2"]).SetProtocolVersion(4).SetAutoReconnect(false).
				SetConnectTimeout(5 * time.Second).SetTLSConfig(tc)
			c := mqtt.NewClient(opts)
			tok := c.Connect()
			if !tok.WaitTimeout(10 * time.Second) {
				return fmt.Errorf("connect timed out")
			}
			if tok.Error() != nil {
				return tok.Error()
			}
			defer c.Disconnect(100)
			pub := c.Publish("telemetry/dev-2", 1, false, fmt.Sprintf(`{"ts":%q,"temp":2}`, ts.Format(time.RFC3339Nano)))
			if !pub.WaitTimeout(10 * time.Second) {
				return fmt.Errorf("publish timed out")
			}
			return pub.Error()
		}
		require.NoError(t, connect("ssl://"+m.MQTTAddr(), tlsClient))
		assert.Error(t, connect("tcp://"+m.MQTTAddr(), nil), "a plain MQTT connection to the TLS listener fails")
	})

	base := "https://" + m.HTTPAddr()
	for _, dev := range []string{"dev-1", "dev-2"} {
		waitFor(t, 50*time.Millisecond, func() bool {
			code, body := httpDo(t, https, http.MethodGet, base+"/v1/devices/"+dev+"/readings/latest", f.tokens["all"])
			return code == http.StatusOK && strings.Contains(body, `"partitionKey"`)
		}, "%s's reading stored", dev)
	}
}

// mqttConnect connects a paho MQTT 3.1.1 client as user/pass.
func mqttConnect(t *testing.T, addr, user, pass string) (mqtt.Client, error) {
	t.Helper()
	opts := mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(user + "-" + fmt.Sprint(time.Now().UnixNano())).
		SetUsername(user).SetPassword(pass).SetProtocolVersion(4).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(10 * time.Second) {
		return nil, fmt.Errorf("connect timed out")
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c, nil
}

func TestMQTTDeviceAuth(t *testing.T) {
	inLane(t, lanes.general)
	m, f := newAuthService(t, func(c *Config) { c.MQTTListen = "127.0.0.1:0" })
	base := "http://" + m.HTTPAddr()
	ts := m.now().UTC()
	addr := m.MQTTAddr()
	require.NotEmpty(t, addr)

	for _, c := range []struct{ user, pass string }{{"dev-1", f.devices["dev-2"]}, {"dev-1", ""}, {"nobody", "x"}} {
		_, err := mqttConnect(t, addr, c.user, c.pass)
		require.Error(t, err, "user %q with a wrong secret", c.user)
	}
	c, err := mqttConnect(t, addr, "dev-1", f.devices["dev-1"])
	require.NoError(t, err, "right secret")
	pub := c.Publish("telemetry/dev-1", 1, false, fmt.Sprintf(`{"ts":%q,"temp":1}`, ts.Format(time.RFC3339Nano)))
	require.True(t, pub.WaitTimeout(10*time.Second))
	require.NoError(t, pub.Error())
	waitFor(t, 20*time.Millisecond, func() bool { return latestCount(t, base, "dev-1", f.tokens["all"]) == 1 })
	cz, err := m.nats.NATS().Connz(&server.ConnzOptions{Account: natsembed.MQTTAccount, Username: true})
	require.NoError(t, err)
	require.Len(t, cz.Conns, 2, "the device and the service's forwarder are in the MQTT account")
	assert.ElementsMatch(t, []string{"dev-1", natsembed.MQTTAdminUser}, []string{cz.Conns[0].AuthorizedUser, cz.Conns[1].AuthorizedUser})

	before := deniedCount(t, base, f.tokens["metrics"], natsembed.DeniedPublish)
	c2, err := mqttConnect(t, addr, "dev-1", f.devices["dev-1"])
	require.NoError(t, err)
	pub = c2.Publish("telemetry/dev-2", 1, false, fmt.Sprintf(`{"ts":%q,"temp":66}`, ts.Format(time.RFC3339Nano)))
	pub.WaitTimeout(3 * time.Second) // the server may drop the client instead of acking
	waitFor(t, 20*time.Millisecond, func() bool { return deniedCount(t, base, f.tokens["metrics"], natsembed.DeniedPublish) > before },
		"the denied publish is counted")
	// A later, allowed reading of dev-1 is stored: the denied one had its
	// chance to be stored before it.
	pub = c.Publish("telemetry/dev-1", 1, false, fmt.Sprintf(`{"ts":%q,"temp":2}`, ts.Add(time.Second).Format(time.RFC3339Nano)))
	require.True(t, pub.WaitTimeout(10*time.Second))
	require.NoError(t, pub.Error())
	waitFor(t, 20*time.Millisecond, func() bool { return latestCount(t, base, "dev-1", f.tokens["all"]) == 2 })
	assert.Equal(t, 0, latestCount(t, base, "dev-2", f.tokens["all"]), "nothing stored for dev-2")
}
