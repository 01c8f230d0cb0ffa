package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// publishDay publishes n readings of dev from at, one a second, from
// number first on.
func publishDay(t *testing.T, s *testService, dev string, at time.Time, first, n int) {
	t.Helper()
	var payloads []string
	for i := first; i < first+n; i++ {
		payloads = append(payloads, fmt.Sprintf(`{"ts":%q,"values":{"temp":%d}}`, at.Add(time.Duration(i)*time.Second).Format(time.RFC3339), i))
	}
	s.publishEach(t, dev, payloads)
}

// TestDamagedTableRepaired: a day table damaged while the service was
// stopped, with readings of the day acked since (held in the stream).
// Repaired by the running service (POST /v1/tables/{day}/repair) or by
// `telemetryd repair` on the stopped one, the day holds every reading
// ever acked: those of the damaged table come back from what is
// readable of it and from the stream, the held ones are committed.
func TestDamagedTableRepaired(t *testing.T) {
	inLane(t, lanes.general)
	at := testEpoch.Add(-3 * time.Hour)
	day := buckets.DayOf(buckets.MustTicks(at))
	damaged := func(t *testing.T) (Config, *testService) {
		cfg := newTestConfig(t)
		s := startService(t, cfg)
		publishDay(t, s, "dev-r", at, 0, 200)
		waitStored(t, s, "dev-r", 200)
		s.stop(t)
		damageTable(t, cfg.DataDir, day)
		return cfg, startService(t, cfg)
	}
	t.Run("by the running service", func(t *testing.T) {
		_, s := damaged(t)
		publishDay(t, s, "dev-r", at, 200, 300)
		waitFor(t, 50*time.Millisecond, func() bool { code, _ := s.readyz(t); return code == http.StatusServiceUnavailable })
		code, body := s.post(t, "/v1/tables/"+day.String()+"/repair", nil, nil)
		require.Equal(t, http.StatusOK, code, body)
		var rep api.TableRepair
		require.NoError(t, json.Unmarshal([]byte(body), &rep))
		assert.Equal(t, int64(500), rep.FromStream, "the stream still holds every message of the day: %s", body)
		assert.NotEmpty(t, rep.DamagedCopy)
		waitStored(t, s, "dev-r", 500)
		s.waitReady(t)
	})
	t.Run("by telemetryd repair", func(t *testing.T) {
		cfg, s := damaged(t)
		publishDay(t, s, "dev-r", at, 200, 300)
		waitFor(t, 50*time.Millisecond, func() bool { code, _ := s.readyz(t); return code == http.StatusServiceUnavailable })
		s.stop(t)
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"repair", "-day", day.String(), "-data-dir", cfg.DataDir}, envMap(nil), &stdout, &stderr)
		require.Equal(t, 0, code, "stdout %s\nstderr %s", stdout.String(), stderr.String())
		assert.Contains(t, stdout.String(), "repaired day "+day.String())
		s = startService(t, cfg)
		waitStored(t, s, "dev-r", 500)
		s.waitReady(t)
	})
}

// TestClusterNodeReplaysARepairedDay: `telemetryd repair` on a stopped
// cluster node's data dir rebuilds the damaged day from its readable
// blocks; the node, started again, writes the stream's readings of the
// day again (read from its partitioned subjects), as a single service
// does, instead of answering from a day that lacks what its damaged
// blocks held.
func TestClusterNodeReplaysARepairedDay(t *testing.T) {
	inLane(t, lanes.cluster)
	at := testEpoch.Add(-3 * time.Hour)
	day := buckets.DayOf(buckets.MustTicks(at))
	nc := startNATSCluster(t, 1)
	n := startConvergedNodes(t, nc, 1, 1, func(*Config) {})[0]
	conn, err := nats.Connect(nc.url(0))
	require.NoError(t, err)
	defer conn.Close()
	js, err := jetstream.New(conn)
	require.NoError(t, err)
	for i := range 200 {
		_, err := js.Publish(context.Background(), "telemetry.dev-r",
			fmt.Appendf(nil, `{"ts":%q,"values":{"temp":%d}}`, at.Add(time.Duration(i)*time.Second).Format(time.RFC3339), i))
		require.NoError(t, err)
	}
	waitFor(t, 50*time.Millisecond, func() bool { return storedOn(t, n.main(), "dev-r") == 200 })
	n.close()
	damageTable(t, n.cfg.DataDir, day)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"repair", "-day", day.String(), "-data-dir", n.cfg.DataDir}, envMap(nil), &stdout, &stderr)
	require.Equal(t, 0, code, "stdout %s\nstderr %s", stdout.String(), stderr.String())
	n.open(testClock())
	waitFor(t, 50*time.Millisecond, func() bool { return storedOn(t, n.main(), "dev-r") == 200 },
		"the repaired day gets the stream's readings again")
}
