package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBacklogWithinMemoryLimit: a backlog of 5,000,000 readings (100 a
// message, 1,000 devices) is published to an external NATS server while
// the service is down; then telemetryd starts as its own process with
// -memory-limit 512MiB (and again, on a fresh data dir, with the default
// limit). Every reading is stored exactly once, and the peak RSS
// (VmHWM) of the 512MiB run stays within 512 MiB. Slow; it only runs
// with TELEMETRY_BACKLOG=1 (TELEMETRY_BACKLOG_READINGS overrides the
// count):
//
//	TELEMETRY_BACKLOG=1 go test ./cmd/telemetryd -run TestBacklogWithinMemoryLimit -v -timeout 60m
func TestBacklogWithinMemoryLimit(t *testing.T) {
	if os.Getenv("TELEMETRY_BACKLOG") != "1" {
		t.Skip("set TELEMETRY_BACKLOG=1 to run the backlog measurement")
	}
	total := 5_000_000
	if v := os.Getenv("TELEMETRY_BACKLOG_READINGS"); v != "" {
		var err error
		total, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	bin := filepath.Join(t.TempDir(), "telemetryd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, limit := range []string{"512MiB", ""} {
		name := limit
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			peak, took := runBacklog(t, bin, limit, total)
			t.Logf("memory limit %s: %d readings stored exactly once in %v (%.0f readings/s); peak RSS (VmHWM) %d MiB",
				name, total, took.Round(time.Second), float64(total)/took.Seconds(), peak>>10)
			if limit == "512MiB" {
				assert.LessOrEqual(t, peak, int64(512<<10), "VmHWM in KiB")
			}
		})
	}
}

// runBacklog publishes total readings to a fresh external server, then
// runs the service until every one is stored; it returns the service's
// VmHWM (KiB) and how long the drain took.
func runBacklog(t *testing.T, bin, limit string, total int) (int64, time.Duration) {
	dir := t.TempDir()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: filepath.Join(dir, "nats"), MaxPayload: 8 << 20, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "TELEMETRY", Subjects: []string{"telemetry.*"},
		Storage: jetstream.FileStorage})
	require.NoError(t, err)

	const perMsg, devices = 100, 1000
	base := time.Now().Add(-2 * time.Hour).UnixMilli()
	var sb strings.Builder
	for m := 0; m < total/perMsg; m++ {
		dev := m % devices
		round := m / devices // the device's message number
		sb.Reset()
		sb.WriteByte('[')
		for i := range perMsg {
			if i > 0 {
				sb.WriteByte(',')
			}
			ts := base + int64(round*perMsg+i)
			fmt.Fprintf(&sb, `{"ts":%d,"temp":%d.%d,"rh":%d,"ok":true}`, ts, 15+i%20, m%10, 40+i%30)
		}
		sb.WriteByte(']')
		_, err := js.PublishAsync(fmt.Sprintf("telemetry.dev-%04d", dev), []byte(sb.String()))
		require.NoError(t, err)
		if m%2000 == 1999 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
	info, err := js.Stream(ctx, "TELEMETRY")
	require.NoError(t, err)
	require.Equal(t, uint64(total/perMsg), info.CachedInfo().State.Msgs)

	httpAddr := freeLoopback(t)
	args := []string{"-data-dir", filepath.Join(dir, "data"), "-http-addr", httpAddr, "-nats-url", ns.ClientURL(),
		"-log-level", "warn"}
	if limit != "" {
		args = append(args, "-memory-limit", limit)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	start := time.Now()
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	var took time.Duration
	waitFor(t, 200*time.Millisecond, func() bool {
		c, err := js.Consumer(ctx, "TELEMETRY", "ingest")
		if err != nil {
			return false
		}
		ci, err := c.Info(ctx)
		if err != nil || ci.NumPending > 0 || ci.NumAckPending > 0 || ci.Delivered.Stream < uint64(total/perMsg) {
			return false
		}
		took = time.Since(start)
		return true
	}, "backlog not drained")
	peak := procStatus(t, cmd.Process.Pid, "VmHWM")

	// Exactly once: the tables count every distinct reading, and nothing
	// was rejected.
	var tables struct {
		Tables []struct {
			Readings int64 `json:"readings"`
		} `json:"tables"`
	}
	waitFor(t, 200*time.Millisecond, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/v1/tables")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		if json.NewDecoder(resp.Body).Decode(&tables) != nil {
			return false
		}
		var n int64
		for _, tb := range tables.Tables {
			n += tb.Readings
		}
		return n == int64(total)
	}, "stored readings: %+v", tables)
	rej, err := js.Stream(ctx, "TELEMETRY_REJECTED")
	require.NoError(t, err)
	assert.Zero(t, rej.CachedInfo().State.Msgs, "nothing dead-lettered")
	peak = max(peak, procStatus(t, cmd.Process.Pid, "VmHWM"))
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	return peak, took
}
