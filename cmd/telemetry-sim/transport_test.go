package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/influxdata/line-protocol/v2/lineprotocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
)

// TestRunOverMQTT publishes through a NATS server's MQTT listener: every
// reading arrives on telemetry.<device> as the JSON the service reads.
func TestRunOverMQTT(t *testing.T) {
	srv, st, addr := ingesttest.RunMQTT(t, "sim-test")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	cfg := testConfig(srv.ClientURL())
	cfg.Protocol, cfg.MQTTURL, cfg.MQTTClients = "mqtt", "tcp://"+addr, 2
	sum := runSim(t, cfg, runDeps{})
	assert.Equal(t, int64(500), sum.Acked, "every QoS 1 publish got its PUBACK")
	require.Eventually(t, func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 50
	}, 10*time.Second, 20*time.Millisecond)
	m, err := st.GetMsg(ctx, 1)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(m.Subject, "telemetry.sim-"), m.Subject)
	var batch []map[string]any
	require.NoError(t, json.Unmarshal(m.Data, &batch))
	assert.Len(t, batch, 10)
}

// TestRunOverLineProtocol posts line protocol; the requests parse and
// carry every reading, with at most -line-writers in flight.
func TestRunOverLineProtocol(t *testing.T) {
	var mu sync.Mutex
	lines, inFlight, maxInFlight := 0, 0, 0
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inFlight++
		maxInFlight = max(maxInFlight, inFlight)
		mu.Unlock()
		defer func() { mu.Lock(); inFlight--; mu.Unlock() }()
		assert.Equal(t, "/api/v2/write", r.URL.Path)
		assert.Equal(t, "ns", r.URL.Query().Get("precision"))
		assert.Equal(t, "Token secret", r.Header.Get("Authorization"))
		body, _ := io.ReadAll(r.Body)
		dec := lineprotocol.NewDecoderWithBytes(body)
		n := 0
		for dec.Next() {
			m, err := dec.Measurement()
			require.NoError(t, err)
			assert.Equal(t, "sim", string(m))
			k, v, err := dec.NextTag()
			require.NoError(t, err)
			assert.Equal(t, "device", string(k))
			assert.True(t, strings.HasPrefix(string(v), "sim-"))
			for {
				k, _, err := dec.NextField()
				require.NoError(t, err)
				if k == nil {
					break
				}
			}
			tm, err := dec.Time(lineprotocol.Nanosecond, time.Time{})
			require.NoError(t, err)
			assert.WithinDuration(t, time.Now(), tm, time.Hour)
			n++
		}
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		lines += n
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer ts.Close()
	cfg := testConfig("nats://unused:4222")
	cfg.Protocol, cfg.HTTPURL, cfg.LineWriters, cfg.Token = "line", ts.URL, 2, "secret"
	sum := runSim(t, cfg, runDeps{})
	assert.Equal(t, int64(500), sum.Acked)
	assert.Equal(t, 500, lines)
	assert.LessOrEqual(t, maxInFlight, 2)
}
