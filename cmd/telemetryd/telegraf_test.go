package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTelegraf runs a real Telegraf (TELEMETRY_TELEGRAF=/path/to/telegraf,
// built as the README says) once with its file input reading line
// protocol and both its InfluxDB outputs, v2 and v1, pointed at the
// service: every line must be stored. It is skipped without the
// variable (the build takes minutes).
func TestTelegraf(t *testing.T) {
	inLane(t, lanes.general)
	bin := os.Getenv("TELEMETRY_TELEGRAF")
	if bin == "" {
		t.Skip("set TELEMETRY_TELEGRAF to a telegraf binary built with inputs.file, parsers.influx, outputs.influxdb_v2 and outputs.influxdb")
	}
	s := startService(t, newTestConfig(t))
	dir := t.TempDir()
	const devices, perDevice = 10, 300
	at := testEpoch.Add(-30 * time.Minute)
	for _, out := range []string{"v1", "v2"} {
		var b strings.Builder
		for i := range devices * perDevice {
			fmt.Fprintf(&b, "%s_env,host=tg-%s-%d,site=north temp=%d.5,count=%di,ok=true %d\n",
				out, out, i%devices, i, i, at.Add(time.Duration(i)*time.Millisecond).UnixNano())
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, out+".lp"), []byte(b.String()), 0o644))
	}
	conf := fmt.Sprintf(`
[agent]
  interval = "1s"
  flush_interval = "1s"
  metric_batch_size = 1000
  metric_buffer_limit = 100000
  omit_hostname = true
  # keep the file's timestamps (by default Telegraf rounds them to the interval)
  precision = "1ns"

[[inputs.file]]
  files = [%[1]q, %[2]q]
  data_format = "influx"

[[outputs.influxdb_v2]]
  urls = [%[3]q]
  token = "unused"
  organization = "fleet"
  bucket = "telemetry"
  content_encoding = "gzip"
  namepass = ["v2_*"]

[[outputs.influxdb]]
  urls = [%[3]q]
  database = "telegraf"
  namepass = ["v1_*"]
`, filepath.Join(dir, "v1.lp"), filepath.Join(dir, "v2.lp"), s.base)
	confPath := filepath.Join(dir, "telegraf.conf")
	require.NoError(t, os.WriteFile(confPath, []byte(conf), 0o644))
	out, err := exec.Command(bin, "--config", confPath, "--once").CombinedOutput()
	t.Logf("telegraf: %s", out)
	require.NoError(t, err)
	assert.NotContains(t, string(out), "E! ")

	for _, o := range []string{"v1", "v2"} {
		for d := range devices {
			device := fmt.Sprintf("tg-%s-%d", o, d)
			waitStored(t, s, device, perDevice)
			code, v := s.point(t, device, at.Add(time.Duration(d)*time.Millisecond))
			require.Equal(t, 200, code)
			assert.Equal(t, map[string]any{o + "_env_temp": float64(d) + 0.5, o + "_env_count": float64(d),
				o + "_env_ok": true}, v)
			waitAttributes(t, s, device, map[string]string{"site": "north"})
		}
	}
}
