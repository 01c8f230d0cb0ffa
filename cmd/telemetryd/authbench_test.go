package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestAuthCost measures what authentication costs, on the real binary:
// end-to-end ingest (publish to stored) and the p50 of latest-10
// queries, with no auth file against an auth file (a gateway credential
// publishing, a bearer token querying), runs alternating in one process.
// It takes a few minutes and only runs with TELEMETRY_AUTHBENCH=1:
//
//	TELEMETRY_AUTHBENCH=1 go test ./cmd/telemetryd -run TestAuthCost -v -timeout 30m
func TestAuthCost(t *testing.T) {
	if os.Getenv("TELEMETRY_AUTHBENCH") != "1" {
		t.Skip("set TELEMETRY_AUTHBENCH=1 to measure the cost of authentication")
	}
	const readings, devices, batch, queries, repeat = 300_000, 100, 100, 3000, 6
	dir := t.TempDir()
	bin := filepath.Join(dir, "telemetryd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	f := newAuthFixture(t, nil, "reader:read", "metrics:metrics")
	gw := authCLI(t, f.path, "add-device", "bench-gw", "-publish-as", "*")

	type result struct{ ingest, p50 []float64 }
	results := map[string]*result{"off": {}, "auth": {}}
	for run := range 2 * repeat {
		// ABBA order, so neither mode always runs after the other.
		mode := []string{"off", "auth", "auth", "off"}[run%4]
		httpAddr, natsAddr := freeLoopback(t), freeLoopback(t)
		args := []string{"-data-dir", filepath.Join(dir, fmt.Sprint("data", run)), "-http-addr", httpAddr, "-nats-listen", natsAddr,
			"-mqtt-listen", "", "-log-level", "warn", "-http-rate", "0"}
		token, user, pass := "", "", ""
		if mode == "auth" {
			args = append(args, "-auth-file", f.path)
			token, user, pass = f.tokens["reader"], "bench-gw", gw
		}
		cmd := exec.Command(bin, args...)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		base := "http://" + httpAddr
		waitReadyz(t, base)
		opts := []nats.Option{}
		if user != "" {
			opts = append(opts, nats.UserInfo(user, pass))
		}
		nc, err := nats.Connect("nats://"+natsAddr, opts...)
		require.NoError(t, err)
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
		require.NoError(t, err)

		start := time.Now()
		t0 := time.Now().UTC().Add(-time.Hour)
		for i := 0; i < readings; i += batch {
			var b strings.Builder
			b.WriteByte('[')
			for j := i; j < i+batch; j++ {
				if j > i {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `{"ts":%d,"temp":%d.25,"hum":%d}`, t0.Add(time.Duration(j/devices)*time.Millisecond).UnixMilli(), j%40, j%90)
			}
			b.WriteByte(']')
			_, err := js.PublishAsync(fmt.Sprintf("telemetry.dev-%03d", (i/batch)%devices), []byte(b.String()))
			require.NoError(t, err)
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(2 * time.Minute):
			t.Fatal("publish acks")
		}
		metricsToken := ""
		if mode == "auth" {
			metricsToken = f.tokens["metrics"]
		}
		waitFor(t, 20*time.Millisecond, func() bool {
			code, body := httpDo(t, nil, http.MethodGet, base+"/metrics", metricsToken)
			return code == http.StatusOK && acceptedReadings(body) >= readings
		})
		ingest := float64(readings) / time.Since(start).Seconds()

		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
		var lat []time.Duration
		for q := range queries {
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/devices/dev-%03d/readings/latest?limit=10", base, q%devices), nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			q0 := time.Now()
			resp, err := client.Do(req)
			require.NoError(t, err)
			_, _ = drainBody(resp)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			lat = append(lat, time.Since(q0))
		}
		slices.Sort(lat)
		p50 := float64(lat[len(lat)/2].Microseconds())
		t.Logf("run %d %-4s: ingest %.0f readings/s, latest-10 p50 %.0f µs", run, mode, ingest, p50)
		results[mode].ingest = append(results[mode].ingest, ingest)
		results[mode].p50 = append(results[mode].p50, p50)
		nc.Close()
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}
	med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	off, on := results["off"], results["auth"]
	t.Logf("median of %d: ingest off %.0f/s, auth %.0f/s (auth/off %.3f); latest-10 p50 off %.0f µs, auth %.0f µs (auth/off %.3f)",
		repeat, med(off.ingest), med(on.ingest), med(on.ingest)/med(off.ingest), med(off.p50), med(on.p50), med(on.p50)/med(off.p50))
}

// acceptedReadings reads telemetry_ingest_readings_total{outcome="accepted"}.
func acceptedReadings(metrics string) int {
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "telemetry_ingest_readings_total{") && strings.Contains(line, `outcome="accepted"`) {
			var v float64
			if _, err := fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v); err == nil {
				return int(v)
			}
		}
	}
	return 0
}

func drainBody(resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	var n int64
	buf := make([]byte, 32<<10)
	for {
		m, err := resp.Body.Read(buf)
		n += int64(m)
		if err != nil {
			return n, nil
		}
	}
}
