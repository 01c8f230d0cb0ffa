package rules

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTemplateErrorAtEvaluation: a template that parses but fails when
// it runs (humanize of a word) is shown in the annotation, as
// Prometheus shows it; the alert still fires with its other
// annotations, and the rule stays healthy.
func TestTemplateErrorAtEvaluation(t *testing.T) {
	gs, err := Load([]string{writeFile(t, "tmpl.yml", `groups:
  - name: temps
    interval: 15s
    rules:
      - alert: Hot
        expr: temp > 30
        annotations:
          summary: "{{ $labels.device }} is hot"
          broken: '{{ humanize "warm" }}'
`)}, 0)
	require.NoError(t, err)
	data := &fakeData{temp: map[string]float64{"f1": 35}}
	m, err := NewManager(Config{Query: data.query, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	m.Update(gs)
	t.Cleanup(m.Stop)
	require.NoError(t, m.EvalAt(t.Context(), "temps", time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)))

	as := activeAlerts(t, m)
	require.Len(t, as, 1)
	assert.Equal(t, "firing", as[0].State)
	assert.Equal(t, "f1 is hot", as[0].Annotations["summary"])
	assert.Contains(t, as[0].Annotations["broken"], "<error expanding template:")
	assert.Contains(t, as[0].Annotations["broken"], `"warm"`)

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/rules", nil))
	var body struct {
		Data struct {
			Groups []struct {
				Rules []apiRule `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Len(t, body.Data.Groups, 1)
	assert.Equal(t, healthOK, body.Data.Groups[0].Rules[0].Health)
}
