package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// alertRules is a rule file of one group evaluated every second: the
// fleet's average recorded as a reading of device fleet-avg, and an
// alert for a device above 30 for 3 seconds.
const alertRules = `groups:
  - name: freezers
    interval: 1s
    rules:
      - record: temp_avg
        expr: avg(temp)
        labels:
          device: fleet-avg
      - alert: FreezerWarm
        expr: temp{device=~"freezer-.*"} > 30
        for: 3s
        labels:
          severity: page
        annotations:
          summary: "{{ $labels.device }} at {{ $value }}"
`

// writeRulesFile writes body to path.
func writeRulesFile(t *testing.T, path, body string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
}

// promAlert is an alert of /api/v1/alerts and /api/v1/rules.
type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	ActiveAt    time.Time         `json:"activeAt"`
	Value       string            `json:"value"`
}

// promRules is the data of /api/v1/rules.
type promRules struct {
	Groups []struct {
		Name     string  `json:"name"`
		File     string  `json:"file"`
		Interval float64 `json:"interval"`
		Rules    []struct {
			Name      string      `json:"name"`
			Query     string      `json:"query"`
			Type      string      `json:"type"`
			State     string      `json:"state"`
			Health    string      `json:"health"`
			LastError string      `json:"lastError"`
			Duration  float64     `json:"duration"`
			Alerts    []promAlert `json:"alerts"`
		} `json:"rules"`
	} `json:"groups"`
}

// alerts returns the service's alerts (GET /api/v1/alerts).
func (s *testService) alerts(t *testing.T) []promAlert {
	t.Helper()
	var r struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	code, body := s.get(t, "/api/v1/alerts", &r)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "success", r.Status, body)
	return r.Data.Alerts
}

// rules returns the service's rules (GET /api/v1/rules).
func (s *testService) rules(t *testing.T) promRules {
	t.Helper()
	var r struct {
		Status string    `json:"status"`
		Data   promRules `json:"data"`
	}
	code, body := s.get(t, "/api/v1/rules", &r)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "success", r.Status, body)
	return r.Data
}

// promSeries is one series of a query's result: an instant vector's
// value or a range query's values, [unix seconds, "value"].
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
	Values [][2]any          `json:"values"`
}

// promQuery asks path (/api/v1/query or /api/v1/query_range) with q.
func (s *testService) promQuery(t *testing.T, path string, q url.Values) []promSeries {
	t.Helper()
	var r struct {
		Data struct {
			Result []promSeries `json:"result"`
		} `json:"data"`
	}
	code, body := s.get(t, path+"?"+q.Encode(), &r)
	require.Equal(t, http.StatusOK, code, "%s: %s", q.Get("query"), body)
	return r.Data.Result
}

// pointValue parses a [unix seconds, "value"] pair.
func pointValue(t *testing.T, p [2]any) (time.Time, float64) {
	t.Helper()
	sec, ok := p[0].(float64)
	require.True(t, ok, "timestamp %v", p[0])
	s, ok := p[1].(string)
	require.True(t, ok, "value %v", p[1])
	v, err := strconv.ParseFloat(s, 64)
	require.NoError(t, err)
	return time.UnixMilli(int64(sec * 1000)).UTC(), v
}

// promTime is t as the PromQL API takes it, to the millisecond.
func promTime(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)
}

// tempReading is a JSON reading of temp at ts.
func tempReading(ts time.Time, temp float64) string {
	return fmt.Sprintf(`{"ts":%q,"values":{"temp":%v}}`, ts.Format(time.RFC3339Nano), temp)
}

// rulesService starts a service evaluating the rule file path on the
// clock now (nil: a test clock).
func rulesService(t *testing.T, cfg Config, path string, now func() time.Time) *testService {
	t.Helper()
	cfg.Alerting.Rules = path
	if now == nil {
		now = testClock()
	}
	return startService(t, cfg, func(m *Main) { m.now = now })
}

// TestAlertRulesService runs the service with -rules: an alert goes
// pending then firing on /api/v1/alerts and /api/v1/rules in
// Prometheus' shapes, the ALERTS and ALERTS_FOR_STATE series and the
// recording rule's result answer PromQL, a bad file at start is an
// error naming file, line and rule, and a reload of a bad file (POST
// /-/reload and the SIGHUP path) keeps the old rules.
func TestAlertRulesService(t *testing.T) {
	inLane(t, lanes.general)
	dir := t.TempDir()
	path := filepath.Join(dir, "freezers.yml")
	writeRulesFile(t, path, alertRules)
	s := rulesService(t, newTestConfig(t), path, nil)
	now := s.now()
	s.publish(t, "freezer-1", tempReading(now, 35))
	s.publish(t, "freezer-2", tempReading(now, 11))

	var pending promAlert
	waitFor(t, 50*time.Millisecond, func() bool {
		as := s.alerts(t)
		if len(as) > 0 {
			pending = as[0]
		}
		return len(as) > 0
	}, "no alert")
	require.Equal(t, "pending", pending.State, "an alert is pending before it fires")
	assert.Equal(t, map[string]string{"alertname": "FreezerWarm", "device": "freezer-1", "severity": "page"}, pending.Labels)
	assert.Equal(t, map[string]string{"summary": "freezer-1 at 35"}, pending.Annotations)
	assert.Equal(t, "3.5e+01", pending.Value)
	require.False(t, pending.ActiveAt.IsZero())

	var firing promAlert
	waitFor(t, 50*time.Millisecond, func() bool {
		as := s.alerts(t)
		if len(as) == 1 {
			firing = as[0]
		}
		return len(as) != 1 || firing.State == "firing"
	}, "the alert never fired")
	require.Equal(t, "firing", firing.State)
	require.Len(t, s.alerts(t), 1)
	assert.Equal(t, pending.ActiveAt, firing.ActiveAt, "activeAt stays when the alert fires")

	t.Run("rules", func(t *testing.T) {
		r := s.rules(t)
		require.Len(t, r.Groups, 1)
		g := r.Groups[0]
		assert.Equal(t, "freezers", g.Name)
		assert.Equal(t, path, g.File)
		assert.Equal(t, 1.0, g.Interval)
		require.Len(t, g.Rules, 2)
		rec, al := g.Rules[0], g.Rules[1]
		assert.Equal(t, "temp_avg", rec.Name)
		assert.Equal(t, "recording", rec.Type)
		assert.Equal(t, "ok", rec.Health, rec.LastError)
		assert.Equal(t, "FreezerWarm", al.Name)
		assert.Equal(t, "alerting", al.Type)
		assert.Equal(t, "firing", al.State)
		assert.Equal(t, "ok", al.Health, al.LastError)
		assert.Equal(t, 3.0, al.Duration)
		require.Len(t, al.Alerts, 1)
		assert.Equal(t, "freezer-1", al.Alerts[0].Labels["device"])
	})

	t.Run("alert series", func(t *testing.T) {
		atTime := s.now().Add(time.Second) // past the evaluation that fired
		at := promTime(atTime)
		got := s.promQuery(t, "/api/v1/query", url.Values{"query": {`ALERTS{alertname="FreezerWarm"}`}, "time": {at}})
		require.Len(t, got, 1)
		assert.Equal(t, map[string]string{"__name__": "ALERTS", "alertname": "FreezerWarm", "alertstate": "firing",
			"device": "freezer-1", "severity": "page"}, got[0].Metric)
		_, v := pointValue(t, got[0].Value)
		assert.Equal(t, 1.0, v)

		got = s.promQuery(t, "/api/v1/query", url.Values{"query": {`ALERTS_FOR_STATE`}, "time": {at}})
		require.Len(t, got, 1)
		_, v = pointValue(t, got[0].Value)
		assert.Equal(t, float64(pending.ActiveAt.Unix()), v, "ALERTS_FOR_STATE is activeAt in seconds")

		// Over time: pending points, then firing ones (the last step is
		// at, when the alert was firing).
		rng := s.promQuery(t, "/api/v1/query_range", url.Values{"query": {`ALERTS{alertname="FreezerWarm"}`},
			"start": {promTime(atTime.Add(-10 * time.Second))}, "end": {at}, "step": {"0.1"}})
		states := map[string]int{}
		for _, sr := range rng {
			states[sr.Metric["alertstate"]] += len(sr.Values)
		}
		assert.Positive(t, states["pending"], "pending points in %v", rng)
		assert.Positive(t, states["firing"], "firing points in %v", rng)
	})

	t.Run("recording rule", func(t *testing.T) {
		waitFor(t, 100*time.Millisecond, func() bool {
			got := s.promQuery(t, "/api/v1/query", url.Values{"query": {`temp_avg{device="fleet-avg"}`},
				"time": {promTime(s.now())}})
			if len(got) == 0 {
				return false
			}
			_, v := pointValue(t, got[0].Value)
			return v == 23
		}, "avg(temp) of 35 and 11, recorded as fleet-avg's temp_avg")
	})

	t.Run("reload keeps the old rules when a file is bad", func(t *testing.T) {
		bad := alertRules + `      - alert: Broken
        expr: temp > > 30
`
		writeRulesFile(t, path, bad)
		code, body := s.do(t, http.MethodPost, "/-/reload")
		assert.Equal(t, http.StatusBadRequest, code, body)
		assert.Contains(t, body, path)
		assert.Contains(t, body, `Broken`)
		assert.Contains(t, body, `17:15`, "line and column of the bad expression")
		// The SIGHUP path: logged, the old rules stay.
		s.ReloadRules(context.Background())
		r := s.rules(t)
		require.Len(t, r.Groups, 1)
		require.Len(t, r.Groups[0].Rules, 2, "the old rules stay")
		as := s.alerts(t)
		require.Len(t, as, 1)
		assert.Equal(t, "firing", as[0].State, "and so do their alerts")

		// A good file is taken.
		writeRulesFile(t, path, alertRules+`      - alert: Cold
        expr: temp < -40
`)
		code, body = s.do(t, http.MethodPost, "/-/reload")
		require.Equal(t, http.StatusOK, code, body)
		r = s.rules(t)
		require.Len(t, r.Groups, 1)
		require.Len(t, r.Groups[0].Rules, 3)
		assert.Equal(t, "Cold", r.Groups[0].Rules[2].Name)
	})

	t.Run("bad file at start", func(t *testing.T) {
		badPath := filepath.Join(t.TempDir(), "bad.yml")
		writeRulesFile(t, badPath, `groups:
  - name: g
    rules:
      - alert: Hot
        expr: temp > > 30
`)
		cfg := newTestConfig(t)
		cfg.Alerting.Rules = badPath
		err := startErr(t, cfg)
		assert.Contains(t, err.Error(), badPath)
		assert.Contains(t, err.Error(), `5:15`)
		assert.Contains(t, err.Error(), `group "g", rule 1, "Hot"`)
	})
}
