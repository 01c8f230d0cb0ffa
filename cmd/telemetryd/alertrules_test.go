package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// TestSilentDevicesAlertRule evaluates the shipped alert rule
// (deploy/alerts/devices.yml) with Prometheus' own rule evaluator:
// `promtool test rules`, fed the telemetry_device_last_seen_timestamp_seconds
// series exactly as the API answers them over the last half hour. The
// alerts it fires must name exactly the devices whose last reading is
// older than 10 minutes, each with its attributes as labels.
//
// promtool's clock starts at 0, so the series are given relative to the
// start of the window (value - start): time() - value is unchanged.
func TestSilentDevicesAlertRule(t *testing.T) {
	inLane(t, lanes.general)
	bin, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not installed; .ci/run installs Debian's prometheus package")
		}
		t.Skip("promtool not installed (apt-get install prometheus)")
	}
	rules, err := filepath.Abs("../../deploy/alerts/devices.yml")
	require.NoError(t, err)
	check := exec.CommandContext(t.Context(), bin, "check", "rules", rules)
	out, err := check.CombinedOutput()
	require.NoError(t, err, "promtool check rules: %s", out)

	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	e := newDashEnv(t, now)
	type device struct {
		id, fleet string
		last      time.Duration // before now
	}
	devices := []device{
		{"live-1", "East", time.Minute},
		{"quiet-1", "East", 11 * time.Minute},
		{"edge-1", "West", 10 * time.Minute}, // exactly 600 s: not silent
		{"gone-1", "West", 2 * time.Hour},
	}
	var rs []buckets.Reading
	var as []buckets.Assignment
	for _, d := range devices {
		for ago := d.last + time.Hour; ago >= d.last; ago -= time.Minute {
			rs = append(rs, newReading(d.id, buckets.MustTicks(now.Add(-ago)), buckets.Field{Name: "temp", Value: buckets.Float(20)}))
		}
		as = append(as, buckets.Assignment{Device: buckets.DeviceID(d.id), At: buckets.MustTicks(now.Add(-3 * time.Hour)),
			Set: buckets.Attributes{{Name: "fleet", Value: d.fleet}}})
	}
	e.write(t, rs...)
	require.NoError(t, e.st.Assign(context.Background(), as))

	// The series as the API answers them, one point a minute.
	start := now.Add(-30 * time.Minute)
	var res struct {
		Data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	q := url.Values{"query": {"telemetry_device_last_seen_timestamp_seconds"}, "step": {"60"},
		"start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(now.Unix(), 10)}}
	status, body := e.getJSON(t, "/api/v1/query_range", q, &res)
	require.Equal(t, 200, status, "%s", body)
	require.Len(t, res.Data.Result, len(devices), "%s", body)
	var series []map[string]string
	for _, s := range res.Data.Result {
		require.Len(t, s.Values, 31, "one point a minute for %v", s.Metric)
		vals := make([]string, len(s.Values))
		for i, p := range s.Values {
			v, err := strconv.ParseFloat(p[1].(string), 64)
			require.NoError(t, err)
			vals[i] = strconv.FormatFloat(v-float64(start.Unix()), 'f', -1, 64)
		}
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(s.Metric)) {
			if k != "__name__" {
				labels = append(labels, fmt.Sprintf("%s=%q", k, s.Metric[k]))
			}
		}
		series = append(series, map[string]string{
			"series": s.Metric["__name__"] + "{" + strings.Join(labels, ",") + "}",
			"values": strings.Join(vals, " "),
		})
	}

	// The alerts Prometheus must fire at an evaluation time, from the
	// fixture alone.
	type alert struct {
		Labels      map[string]string `json:"exp_labels"`
		Annotations map[string]string `json:"exp_annotations"`
	}
	expect := func(at time.Duration) []alert {
		var want []alert
		for _, d := range devices {
			// A reading every whole minute up to now - d.last: the last
			// one at or before a whole-minute evaluation time.
			evalAt := start.Add(at)
			silent := max(evalAt.Sub(now.Add(-d.last)), 0)
			if silent <= 10*time.Minute {
				continue
			}
			want = append(want, alert{
				Labels:      map[string]string{"alertname": "DeviceSilent", "severity": "warning", "device": d.id, "fleet": d.fleet},
				Annotations: map[string]string{"summary": d.id + " has sent nothing for " + humanize(silent)},
			})
		}
		return want
	}
	tests := map[string]any{
		"rule_files":          []string{rules},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval":     "1m",
			"input_series": series,
			"alert_rule_test": []any{
				map[string]any{"eval_time": "30m", "alertname": "DeviceSilent", "exp_alerts": expect(30 * time.Minute)},
				map[string]any{"eval_time": "20m", "alertname": "DeviceSilent", "exp_alerts": expect(20 * time.Minute)},
			},
		}},
	}
	require.Len(t, expect(30*time.Minute), 2, "the fixture has two silent devices at the end")
	require.Len(t, expect(20*time.Minute), 1, "and one ten minutes earlier")
	file := filepath.Join(t.TempDir(), "test.yml")
	b, err := json.Marshal(tests) // JSON is YAML
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, b, 0o600))
	cmd := exec.CommandContext(t.Context(), bin, "test", "rules", file)
	out, err = cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	require.NoError(t, err, "%s", out)
}

// humanize is Prometheus' humanizeDuration for whole minutes of an
// hour or more, or less.
func humanize(d time.Duration) string {
	h, m := int(d.Hours()), int(d.Minutes())%60
	if h > 0 {
		return fmt.Sprintf("%dh %dm 0s", h, m)
	}
	return fmt.Sprintf("%dm 0s", m)
}
