package rules

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeData is the consumer-side stand-in for the engine: the value of
// temp per device, answered for "temp > 30".
type fakeData struct {
	mu   sync.Mutex
	temp map[string]float64
}

func (f *fakeData) set(dev string, v float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.temp[dev] = v
}

func (f *fakeData) query(_ context.Context, expr string, ts time.Time) (promql.Vector, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out promql.Vector
	for d, v := range f.temp {
		if v > 30 {
			out = append(out, promql.Sample{Metric: labels.FromStrings("__name__", "temp", "device", d), F: v, T: ts.UnixMilli()})
		}
	}
	return out, nil
}

type captured struct {
	mu  sync.Mutex
	all []Notification
}

func (c *captured) Send(ns []Notification) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all = append(c.all, ns...)
}

func (c *captured) take() []Notification {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.all
	c.all = nil
	return out
}

type memStates struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *memStates) Load(_ context.Context, k string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[k], nil
}

func (s *memStates) Save(_ context.Context, k string, b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[k] = append([]byte(nil), b...)
	return nil
}

const hotRules = `groups:
  - name: temps
    interval: 15s
    labels:
      team: ops
    rules:
      - alert: Hot
        expr: temp > 30
        for: 1m
        keep_firing_for: 30s
        labels:
          severity: page
        annotations:
          summary: "{{ $labels.device }} is at {{ $value | humanize }} degrees"
`

func newTestManager(t *testing.T, data *fakeData, sent *captured, states StateStore) *Manager {
	t.Helper()
	gs, err := Load([]string{writeFile(t, "hot.yml", hotRules)}, 0)
	require.NoError(t, err)
	m, err := NewManager(Config{Query: data.query, Sender: sent, States: states,
		ExternalLabels: labels.FromStrings("site", "lab"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	m.Update(gs)
	t.Cleanup(m.Stop)
	return m
}

func activeAlerts(t *testing.T, m *Manager) []apiAlert {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/alerts", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	var body struct {
		Data struct {
			Alerts []apiAlert `json:"alerts"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	return body.Data.Alerts
}

func TestAlertLifecycle(t *testing.T) {
	data := &fakeData{temp: map[string]float64{"f1": 20, "f2": 20}}
	sent := &captured{}
	m := newTestManager(t, data, sent, nil)
	ctx := t.Context()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	step := func(i int) time.Time { return t0.Add(time.Duration(i) * 15 * time.Second) }

	require.NoError(t, m.EvalAt(ctx, "temps", step(0)))
	assert.Empty(t, activeAlerts(t, m))

	data.set("f1", 35.25)
	require.NoError(t, m.EvalAt(ctx, "temps", step(1)))
	as := activeAlerts(t, m)
	require.Len(t, as, 1)
	assert.Equal(t, "pending", as[0].State)
	assert.Equal(t, map[string]string{"alertname": "Hot", "device": "f1", "severity": "page", "team": "ops"}, as[0].Labels)
	assert.Equal(t, "f1 is at 35.25 degrees", as[0].Annotations["summary"])
	assert.Empty(t, sent.take(), "pending alerts are not sent")

	// for: 1m: pending at steps 1..4, firing at step 5 (60 s after).
	for i := 2; i <= 4; i++ {
		require.NoError(t, m.EvalAt(ctx, "temps", step(i)))
		assert.Equal(t, "pending", activeAlerts(t, m)[0].State, "step %d", i)
	}
	require.NoError(t, m.EvalAt(ctx, "temps", step(5)))
	assert.Equal(t, "firing", activeAlerts(t, m)[0].State)
	ns := sent.take()
	require.Len(t, ns, 1)
	assert.Equal(t, "lab", ns[0].Labels.Get("site"), "external labels")
	assert.Equal(t, step(5), ns[0].StartsAt)
	assert.Equal(t, step(5).Add(4*time.Minute), ns[0].EndsAt, "valid for 4 x max(interval, resend delay)")
	assert.False(t, ns[0].Resolved)

	// Re-sent once the resend delay (1 m) has passed: steps 6..8 send
	// nothing, step 9 re-sends.
	for i := 6; i <= 8; i++ {
		require.NoError(t, m.EvalAt(ctx, "temps", step(i)))
		assert.Empty(t, sent.take(), "step %d", i)
	}
	require.NoError(t, m.EvalAt(ctx, "temps", step(9)))
	require.Len(t, sent.take(), 1)

	// The value comes back: keep_firing_for 30s holds it at steps 10
	// and 11, it resolves at step 12, and is sent resolved once.
	data.set("f1", 20)
	for i := 10; i <= 11; i++ {
		require.NoError(t, m.EvalAt(ctx, "temps", step(i)))
		as := activeAlerts(t, m)
		require.Len(t, as, 1, "step %d", i)
		assert.Equal(t, "firing", as[0].State)
		require.NotNil(t, as[0].KeepFiringSince)
	}
	assert.Empty(t, sent.take())
	require.NoError(t, m.EvalAt(ctx, "temps", step(12)))
	assert.Empty(t, activeAlerts(t, m))
	ns = sent.take()
	require.Len(t, ns, 1)
	assert.True(t, ns[0].Resolved)
	assert.Equal(t, step(12), ns[0].EndsAt)
	for i := 13; i <= 20; i++ {
		require.NoError(t, m.EvalAt(ctx, "temps", step(i)))
	}
	assert.Empty(t, sent.take(), "a resolved alert is sent once")
}

func TestAlertSeries(t *testing.T) {
	data := &fakeData{temp: map[string]float64{"f1": 40}}
	m := newTestManager(t, data, &captured{}, nil)
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	require.NoError(t, m.EvalAt(t.Context(), "temps", t0))
	q, err := m.Series().Querier(t0.Add(-time.Minute).UnixMilli(), t0.UnixMilli())
	require.NoError(t, err)
	ss := q.Select(t.Context(), true, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", AlertsForStateName))
	require.True(t, ss.Next())
	s := ss.At()
	assert.Equal(t, "f1", s.Labels().Get("device"))
	it := s.Iterator(nil)
	require.NotEqual(t, 0, it.Next())
	_, v := it.At()
	assert.Equal(t, float64(t0.Unix()), v, "ALERTS_FOR_STATE is activeAt in seconds")
	assert.False(t, ss.Next())
}

// TestRestoreDuringFor: an alert pending when the service stops fires
// when its for has passed since it became pending, not a for after the
// restart, and a firing alert is not sent again before its resend
// delay.
func TestRestoreDuringFor(t *testing.T) {
	data := &fakeData{temp: map[string]float64{"f1": 40}}
	states := &memStates{m: map[string][]byte{}}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	step := func(i int) time.Time { return t0.Add(time.Duration(i) * 15 * time.Second) }

	m1 := newTestManager(t, data, &captured{}, states)
	require.NoError(t, m1.EvalAt(t.Context(), "temps", step(0)))
	require.NoError(t, m1.EvalAt(t.Context(), "temps", step(1)))
	m1.Stop()

	sent := &captured{}
	m2 := newTestManager(t, data, sent, states)
	// Down for 15 s: the next evaluation is at step 3, still pending.
	require.NoError(t, m2.EvalAt(t.Context(), "temps", step(3)))
	as := activeAlerts(t, m2)
	require.Len(t, as, 1)
	assert.Equal(t, "pending", as[0].State)
	assert.Equal(t, t0, *as[0].ActiveAt, "activeAt restored")
	require.NoError(t, m2.EvalAt(t.Context(), "temps", step(4)))
	assert.Equal(t, "firing", activeAlerts(t, m2)[0].State, "fires 1 m after it became pending")
	require.Len(t, sent.take(), 1)

	t.Run("firing alert is not sent twice", func(t *testing.T) {
		m2.Stop()
		sent3 := &captured{}
		m3 := newTestManager(t, data, sent3, states)
		require.NoError(t, m3.EvalAt(t.Context(), "temps", step(5)))
		assert.Equal(t, "firing", activeAlerts(t, m3)[0].State)
		assert.Empty(t, sent3.take(), "sent at step 4; the resend delay has not passed")
		require.NoError(t, m3.EvalAt(t.Context(), "temps", step(8)))
		assert.Len(t, sent3.take(), 1)
	})
	t.Run("older than the outage tolerance", func(t *testing.T) {
		m4 := newTestManager(t, data, &captured{}, states)
		require.NoError(t, m4.EvalAt(t.Context(), "temps", step(9).Add(2*time.Hour)))
		assert.Equal(t, "pending", activeAlerts(t, m4)[0].State, "state not restored after a 2 h outage")
	})
}
