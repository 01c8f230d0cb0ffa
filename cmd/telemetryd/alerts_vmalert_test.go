package main

import (
	"encoding/json"
	"math"

	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// amReceiver collects alerts posted to Alertmanager's API v2
// (POST <prefix>/api/v2/alerts) by the evaluator named by the path's
// prefix: /service or /vmalert.
type amReceiver struct {
	mu  sync.Mutex
	got map[string][]amPosted
}

// amPosted is an alert of POST /api/v2/alerts.
type amPosted struct {
	Labels   map[string]string `json:"labels"`
	StartsAt time.Time         `json:"startsAt"`
	EndsAt   time.Time         `json:"endsAt"`
	received time.Time
}

func (r *amReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	who, rest, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/"), "/")
	if req.Method != http.MethodPost || rest != "api/v2/alerts" {
		http.NotFound(w, req)
		return
	}
	var as []amPosted
	if err := json.NewDecoder(req.Body).Decode(&as); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	now := time.Now()
	r.mu.Lock()
	for i := range as {
		as[i].received = now
	}
	r.got[who] = append(r.got[who], as...)
	r.mu.Unlock()
}

// timeline is what one evaluator did with one alert: when it became
// pending (activeAt), fired (the first firing notification's startsAt)
// and resolved (the resolved notification's endsAt).
type timeline struct {
	activeAt, firedAt, resolvedAt time.Time
	// resolvedSent counts resolved notifications, resolvedEnds their
	// distinct endsAt.
	resolvedSent, resolvedEnds int
}

// timelineOf gathers device's alert from the notifications of who and
// the activeAt its API showed.
func (r *amReceiver) timelineOf(who, device string, activeAt time.Time) timeline {
	r.mu.Lock()
	defer r.mu.Unlock()
	tl := timeline{activeAt: activeAt}
	for _, a := range r.got[who] {
		if a.Labels["device"] != device {
			continue
		}
		resolved := !a.EndsAt.IsZero() && !a.EndsAt.After(a.received)
		switch {
		case resolved:
			tl.resolvedSent++
			if !a.EndsAt.Equal(tl.resolvedAt) {
				tl.resolvedEnds++
			}
			tl.resolvedAt = a.EndsAt
		case tl.firedAt.IsZero():
			tl.firedAt = a.StartsAt
		}
	}
	return tl
}

func (r *amReceiver) devices(who string) map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	for _, a := range r.got[who] {
		out[a.Labels["device"]] = true
	}
	return out
}

// activeAts polls an evaluator's GET /api/v1/alerts (Prometheus' shape)
// and keeps each device's activeAt.
func activeAts(t *testing.T, base string, into map[string]time.Time) {
	var r struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	resp, err := http.Get(base + "/api/v1/alerts")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&r) != nil {
		return
	}
	for _, a := range r.Data.Alerts {
		if _, ok := into[a.Labels["device"]]; !ok {
			into[a.Labels["device"]] = a.ActiveAt
		}
	}
}

// TestVmalertAgrees evaluates one rule file with vmalert (set
// TELEMETRY_VMALERT to the binary, built from VictoriaMetrics'
// app/vmalert) against the service's PromQL API and with the service
// itself, on the same readings: the same alerts go pending, fire and
// resolve at the same evaluation steps. The two evaluate every second
// at their own phase within the second, so a step is counted from the
// change of the data: step 0 is the first evaluation at or after it.
// The readings are published before their timestamps come, so neither
// evaluator can see a change late because of ingestion.
func TestVmalertAgrees(t *testing.T) {
	inLane(t, lanes.general)
	bin := os.Getenv("TELEMETRY_VMALERT")
	if bin == "" {
		t.Skip("set TELEMETRY_VMALERT to a vmalert binary to run this test (api/rules/README.md)")
	}
	const iv = time.Second
	recv := &amReceiver{got: map[string][]amPosted{}}
	rs := httptest.NewServer(recv)
	t.Cleanup(rs.Close)

	path := filepath.Join(t.TempDir(), "compare.yml")
	writeRulesFile(t, path, `groups:
  - name: compare
    interval: 1s
    rules:
      - alert: Hot
        expr: temp > 30
        for: 3s
        labels:
          severity: page
        annotations:
          summary: "{{ $labels.device }} at {{ $value }}"
`)
	cfg := newTestConfig(t)
	cfg.Alerting.Alertmanagers = []string{rs.URL + "/service"}
	s := rulesService(t, cfg, path, time.Now) // vmalert evaluates at the real time

	vmAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	vmBase := "http://" + vmAddr
	startExternal(t, "vmalert", vmBase+"/api/v1/rules", exec.Command(bin, "-rule="+path, "-datasource.url="+s.base,
		"-notifier.url="+rs.URL+"/vmalert", "-evaluationInterval=1s", "-rule.evalDelay=0", "-httpListenAddr="+vmAddr, "-loggerLevel=WARN"))
	time.Sleep(2 * iv) // both evaluating

	// fridge-1 is hot for 7 s (fires, then resolves), fridge-2 for 2 s
	// (pending, never fires); both cold before and after.
	now := time.Now()
	d1 := now.Add(3 * iv)
	d2 := d1.Add(7 * iv)
	for _, r := range []struct {
		dev  string
		at   time.Time
		temp float64
	}{
		{"fridge-1", now, 5}, {"fridge-2", now, 5},
		{"fridge-1", d1, 50}, {"fridge-2", d1, 50},
		{"fridge-2", d1.Add(2 * iv), 5}, {"fridge-1", d2, 5},
	} {
		s.publish(t, r.dev, tempReading(r.at, r.temp))
	}
	actives := map[string]map[string]time.Time{"service": {}, "vmalert": {}}
	bases := map[string]string{"service": s.base, "vmalert": vmBase}
	waitFor(t, 100*time.Millisecond, func() bool {
		for who, base := range bases {
			activeAts(t, base, actives[who])
		}
		return recv.timelineOf("service", "fridge-1", time.Time{}).resolvedSent > 0 &&
			recv.timelineOf("vmalert", "fridge-1", time.Time{}).resolvedSent > 0
	}, "both evaluators resolve fridge-1's alert")
	time.Sleep(3 * iv) // any late notification

	step := func(at, from time.Time) int { return int(math.Floor(float64(at.Sub(from)) / float64(iv))) }
	type steps struct{ Pending1, Fired1, Resolved1, Pending2 int }
	stepsOf := func(who string) steps {
		tl := recv.timelineOf(who, "fridge-1", actives[who]["fridge-1"])
		require.False(t, tl.activeAt.IsZero(), "%s: fridge-1 never seen pending", who)
		require.False(t, tl.firedAt.IsZero(), "%s: fridge-1 never fired", who)
		require.Equal(t, 1, tl.resolvedEnds, "%s: one resolution", who)
		if who == "service" {
			require.Equal(t, 1, tl.resolvedSent, "the service sends a resolved alert once, as Prometheus does")
		}
		require.Contains(t, actives[who], "fridge-2", "%s: fridge-2 never seen pending", who)
		st := steps{Pending1: step(tl.activeAt, d1), Fired1: step(tl.firedAt, d1), Resolved1: step(tl.resolvedAt, d2),
			Pending2: step(actives[who]["fridge-2"], d1)}
		t.Logf("%-7s fridge-1 pending %s, fired %s after the change, resolved %s after the change back; fridge-2 pending %s after; %d resolved notifications; steps %+v",
			who, tl.activeAt.Sub(d1).Round(time.Millisecond), tl.firedAt.Sub(d1).Round(time.Millisecond),
			tl.resolvedAt.Sub(d2).Round(time.Millisecond), actives[who]["fridge-2"].Sub(d1).Round(time.Millisecond), tl.resolvedSent, st)
		return st
	}
	svc, vm := stepsOf("service"), stepsOf("vmalert")
	assert.Equal(t, steps{Pending1: 0, Fired1: 3, Resolved1: 0, Pending2: 0}, svc, "the service, by Prometheus' rules")
	assert.Equal(t, svc, vm, "vmalert and the service at the same steps")
	for who := range bases {
		assert.Equal(t, map[string]bool{"fridge-1": true}, recv.devices(who), "%s: only fridge-1 was sent", who)
	}
}
