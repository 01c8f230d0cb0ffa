package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
)

// runNATS starts a standalone JetStream server on port (-1: random)
// with its store in dir.
func runNATS(t *testing.T, port int, dir string) *server.Server {
	t.Helper()
	return ingesttest.RunNATS(t, func(o *server.Options) { o.Port, o.StoreDir = port, dir })
}

func TestExternalNATSOutage(t *testing.T) {
	inLane(t, lanes.general)
	natsDir := t.TempDir()
	ns := runNATS(t, -1, natsDir)
	port := ns.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { ns.Shutdown() })

	cfg := newTestConfig(t)
	cfg.NATSURL = ns.ClientURL()
	s := startService(t, cfg)

	// The publisher has its own connection that rides out the outage.
	pc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(pc.Close)
	js, err := jetstream.New(pc)
	require.NoError(t, err)
	acked := 0
	publish := func(n int) {
		for i := 0; i < n; i++ {
			at := testEpoch.Add(-time.Hour).Add(time.Duration(acked) * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := js.Publish(ctx, "telemetry.dev-out", []byte(fmt.Sprintf(`{"ts":%d,"n":%d}`, at.UnixMilli(), acked)))
			cancel()
			require.NoError(t, err)
			acked++
		}
	}
	publish(200)

	ns.Shutdown()
	ns.WaitForShutdown()
	waitFor(t, 50*time.Millisecond, func() bool {
		code, _ := s.get(t, "/readyz", nil)
		return code == http.StatusServiceUnavailable
	}, "/readyz must report the outage")
	time.Sleep(5 * time.Second)
	code, body := s.get(t, "/readyz", nil)
	assert.Equal(t, http.StatusServiceUnavailable, code, body)

	ns2 := runNATS(t, port, natsDir)
	t.Cleanup(func() { ns2.Shutdown() })
	s.waitReady(t)
	publish(200)
	waitStored(t, s, "dev-out", acked)
}

func TestDamagedDayTable(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	s := startService(t, cfg)
	fs := threeDays([]string{"dev-1"})
	publishAll(t, s, fs)
	waitStored(t, s, "dev-1", len(fs))
	s.stop(t)

	yesterday := testEpoch.AddDate(0, 0, -1).Format("2006-01-02")
	dir := filepath.Join(cfg.DataDir, "tables", yesterday)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	damaged := 0
	for _, e := range entries {
		if e.Name() == "MANIFEST" || filepath.Ext(e.Name()) == ".sst" || filepath.Ext(e.Name()) == ".vlog" || filepath.Ext(e.Name()) == ".mem" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, e.Name()), []byte("this is not a badger file"), 0o644))
			damaged++
		}
	}
	require.NotZero(t, damaged, "no table files found in %s", dir)

	s2 := startService(t, cfg)
	today := testEpoch.Truncate(24 * time.Hour)
	var l apiList
	q := url.Values{"from": {today.Format(time.RFC3339)}, "to": {testEpoch.Format(time.RFC3339)}, "order": {"asc"}}
	code, body := s2.get(t, "/v1/devices/dev-1/readings?"+q.Encode(), &l)
	require.Equal(t, http.StatusOK, code, body)
	assert.Len(t, l.Readings, 4, "today's table still serves")

	q.Set("from", today.AddDate(0, 0, -1).Format(time.RFC3339))
	q.Set("to", today.Format(time.RFC3339))
	code, body = s2.get(t, "/v1/devices/dev-1/readings?"+q.Encode(), nil)
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	assert.Contains(t, body, `"unavailable"`)
	assert.Contains(t, body, yesterday, "the error names the broken day")

	q.Set("from", today.AddDate(0, 0, -2).Format(time.RFC3339))
	q.Set("to", today.AddDate(0, 0, -1).Format(time.RFC3339))
	code, body = s2.get(t, "/v1/devices/dev-1/readings?"+q.Encode(), &l)
	require.Equal(t, http.StatusOK, code, body)
	assert.Len(t, l.Readings, 6, "the day before the broken one still serves")

	// A reading for today is acked and kept: stored at once, or, once
	// the ingester has seen the damaged day and paused (the readings
	// wait in the stream until the day is repaired or dropped), stored
	// after the day is dropped.
	s2.publish(t, "dev-1", `{"ts":`+strconv.FormatInt(testEpoch.Add(-time.Second).UnixMilli(), 10)+`,"temp":1}`)
	code, body = s2.do(t, http.MethodDelete, "/v1/tables/"+yesterday)
	require.Equal(t, http.StatusOK, code, body)
	waitFor(t, 20*time.Millisecond, func() bool {
		var l apiList
		code, _ := s2.get(t, "/v1/devices/dev-1/readings/latest?limit=1", &l)
		return code == http.StatusOK && len(l.Readings) == 1 && l.Readings[0].Values["temp"] == float64(1)
	}, "today's reading stored")
	s2.waitReady(t)
}
