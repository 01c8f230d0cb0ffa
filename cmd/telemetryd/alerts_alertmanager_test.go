package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hookReceiver collects Alertmanager's webhook notifications.
type hookReceiver struct {
	mu   sync.Mutex
	msgs []amWebhook
}

// amWebhook is the part of Alertmanager's webhook payload the test reads.
type amWebhook struct {
	Status string `json:"status"`
	Alerts []struct {
		Status string            `json:"status"`
		Labels map[string]string `json:"labels"`
		EndsAt time.Time         `json:"endsAt"`
	} `json:"alerts"`
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var m amWebhook
	if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.msgs = append(h.msgs, m)
	h.mu.Unlock()
}

// count returns how many notifications had status.
func (h *hookReceiver) count(status string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if m.Status == status {
			n++
		}
	}
	return n
}

func (h *hookReceiver) all() []amWebhook {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]amWebhook(nil), h.msgs...)
}

// startAlertmanager runs the Alertmanager binary bin on a free port,
// routing every alert to a webhook at hookURL with resolved
// notifications, and returns its base URL.
func startAlertmanager(t *testing.T, bin, hookURL string) string {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "alertmanager.yml")
	require.NoError(t, os.WriteFile(conf, fmt.Appendf(nil, `route:
  receiver: hook
  group_by: [alertname]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: %s
        send_resolved: true
`, hookURL), 0o600))
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	base := "http://" + addr
	startExternal(t, "alertmanager", base+"/-/ready", exec.Command(bin, "--config.file="+conf,
		"--storage.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--cluster.listen-address="))
	return base
}

// startExternal starts cmd, a program the test drives (name in its
// messages), and waits until readyURL answers 200. The program is
// killed at the end of the test; its output is logged when the test
// failed.
func startExternal(t *testing.T, name, readyURL string, cmd *exec.Cmd) {
	t.Helper()
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s:\n%s", name, logs.String())
		}
	})
	waitFor(t, 50*time.Millisecond, func() bool {
		resp, err := http.Get(readyURL)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "%s never became ready", name)
}

// amGroup is a group of Alertmanager's GET /api/v2/alerts/groups.
type amGroup struct {
	Labels map[string]string `json:"labels"`
	Alerts []struct {
		Labels map[string]string `json:"labels"`
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	} `json:"alerts"`
}

func amGroups(t *testing.T, base string) []amGroup {
	t.Helper()
	resp, err := http.Get(base + "/api/v2/alerts/groups")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	var gs []amGroup
	require.NoError(t, json.Unmarshal(body, &gs), "%s", body)
	return gs
}

// TestAlertmanager sends alerts to a real Alertmanager (set
// TELEMETRY_ALERTMANAGER to the binary, built from its source with
// `go build ./cmd/alertmanager`): a device above a threshold for `for`
// makes exactly one firing group in Alertmanager, which notifies its
// webhook once; when the values come back, one resolved notification
// follows.
func TestAlertmanager(t *testing.T) {
	inLane(t, lanes.general)
	bin := os.Getenv("TELEMETRY_ALERTMANAGER")
	if bin == "" {
		t.Skip("set TELEMETRY_ALERTMANAGER to an alertmanager binary to run this test (api/rules/README.md)")
	}
	hook := &hookReceiver{}
	hs := httptest.NewServer(hook)
	t.Cleanup(hs.Close)
	am := startAlertmanager(t, bin, hs.URL+"/hook")

	path := filepath.Join(t.TempDir(), "freezer.yml")
	writeRulesFile(t, path, `groups:
  - name: freezers
    interval: 1s
    rules:
      - alert: FreezerWarm
        expr: temp > -15
        for: 3s
        labels:
          severity: page
        annotations:
          summary: "{{ $labels.device }} at {{ $value }} °C"
`)
	cfg := newTestConfig(t)
	cfg.Alerting.Alertmanagers = []string{am}
	cfg.Alerting.ExternalLabels = "site=north"
	// Alertmanager judges startsAt and endsAt by its own clock: the
	// service runs on the real one.
	s := rulesService(t, cfg, path, time.Now)
	s.publish(t, "freezer-1", tempReading(s.now(), -20))
	s.publish(t, "freezer-2", tempReading(s.now(), -5))

	waitFor(t, 100*time.Millisecond, func() bool { return len(amGroups(t, am)) > 0 },
		"no alert reached Alertmanager")
	gs := amGroups(t, am)
	require.Len(t, gs, 1, "one firing group")
	assert.Equal(t, map[string]string{"alertname": "FreezerWarm"}, gs[0].Labels)
	require.Len(t, gs[0].Alerts, 1)
	assert.Equal(t, map[string]string{"alertname": "FreezerWarm", "device": "freezer-2", "severity": "page", "site": "north"},
		gs[0].Alerts[0].Labels)
	assert.Equal(t, "active", gs[0].Alerts[0].Status.State)
	waitFor(t, 50*time.Millisecond, func() bool { return hook.count("firing") > 0 },
		"Alertmanager never notified the firing alert")

	// The value comes back under the threshold.
	s.publish(t, "freezer-2", tempReading(s.now(), -18))
	waitFor(t, 50*time.Millisecond, func() bool { return hook.count("resolved") > 0 },
		"Alertmanager never notified the resolution")
	assert.Empty(t, amGroups(t, am), "no active alert in Alertmanager")
	// Several group intervals later: still one of each.
	time.Sleep(3 * time.Second)
	msgs := hook.all()
	assert.Equal(t, 1, hook.count("firing"), "firing notifications: %+v", msgs)
	assert.Equal(t, 1, hook.count("resolved"), "resolved notifications: %+v", msgs)
	for _, m := range msgs {
		require.Len(t, m.Alerts, 1)
		assert.Equal(t, "freezer-2", m.Alerts[0].Labels["device"])
		assert.Equal(t, m.Status, m.Alerts[0].Status)
	}
}
