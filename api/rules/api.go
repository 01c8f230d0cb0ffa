package rules

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/telemetryd/telemetryd/api/auth"
)

// apiAlert is an alert in /api/v1/alerts and /api/v1/rules.
type apiAlert struct {
	Labels          map[string]string `json:"labels"`
	Annotations     map[string]string `json:"annotations"`
	State           string            `json:"state"`
	ActiveAt        *time.Time        `json:"activeAt,omitempty"`
	KeepFiringSince *time.Time        `json:"keepFiringSince,omitempty"`
	Value           string            `json:"value"`
}

type apiRule struct {
	State          string            `json:"state,omitempty"`
	Name           string            `json:"name"`
	Query          string            `json:"query"`
	Duration       float64           `json:"duration,omitempty"`
	KeepFiringFor  float64           `json:"keepFiringFor,omitempty"`
	Labels         map[string]string `json:"labels"`
	Annotations    map[string]string `json:"annotations,omitempty"`
	Alerts         []apiAlert        `json:"alerts,omitempty"`
	Health         string            `json:"health"`
	LastError      string            `json:"lastError,omitempty"`
	EvaluationTime float64           `json:"evaluationTime"`
	LastEvaluation time.Time         `json:"lastEvaluation"`
	Type           string            `json:"type"`
}

type apiGroup struct {
	Name           string    `json:"name"`
	File           string    `json:"file"`
	Rules          []apiRule `json:"rules"`
	Interval       float64   `json:"interval"`
	Limit          int       `json:"limit"`
	EvaluationTime float64   `json:"evaluationTime"`
	LastEvaluation time.Time `json:"lastEvaluation"`
}

// Handler serves GET /api/v1/rules and GET /api/v1/alerts in
// Prometheus' shapes. A token limited to device patterns sees only the
// alerts of its devices (and those without a device label).
func (m *Manager) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/alerts", m.handleAlerts)
	mux.HandleFunc("GET /api/v1/rules", m.handleRules)
	return mux
}

func visibleAlert(p *auth.Principal, a *Alert) bool {
	d := a.Labels.Get("device")
	return d == "" || p.DeviceVisible(d)
}

func toAPIAlert(a *Alert) apiAlert {
	out := apiAlert{Labels: a.Labels.Map(), Annotations: a.Annotations.Map(), State: a.State.String(),
		Value: strconv.FormatFloat(a.Value, 'e', -1, 64)}
	if !a.ActiveAt.IsZero() {
		t := a.ActiveAt
		out.ActiveAt = &t
	}
	if !a.KeepFiringSince.IsZero() {
		t := a.KeepFiringSince
		out.KeepFiringSince = &t
	}
	return out
}

// alertsOf returns the visible pending and firing alerts of r, sorted
// by labels.
func alertsOf(r *ruleState, p *auth.Principal) []apiAlert {
	var as []*Alert
	for _, a := range r.alerts.active {
		if a.State != StateInactive && visibleAlert(p, a) {
			as = append(as, a)
		}
	}
	slices.SortFunc(as, func(a, b *Alert) int { return labels.Compare(a.Labels, b.Labels) })
	out := make([]apiAlert, 0, len(as))
	for _, a := range as {
		out = append(out, toAPIAlert(a))
	}
	return out
}

func (m *Manager) handleAlerts(w http.ResponseWriter, r *http.Request) {
	p := auth.FromContext(r.Context())
	out := []apiAlert{}
	for _, g := range m.snapshot() {
		g.mu.Lock()
		for _, rs := range g.rules {
			out = append(out, alertsOf(rs, p)...)
		}
		g.mu.Unlock()
	}
	writeJSON(w, map[string]any{"alerts": out})
}

func (m *Manager) handleRules(w http.ResponseWriter, r *http.Request) {
	p := auth.FromContext(r.Context())
	typ := r.URL.Query().Get("type")
	if typ != "" && typ != "alert" && typ != "record" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "error", "errorType": "bad_data",
			"error": `invalid parameter "type": want alert or record`})
		return
	}
	groups := []apiGroup{}
	for _, g := range m.snapshot() {
		g.mu.Lock()
		ag := apiGroup{Name: g.spec.Name, File: g.spec.File, Interval: g.spec.Interval.Seconds(), Limit: g.spec.Limit,
			EvaluationTime: g.evalDur.Seconds(), LastEvaluation: g.lastEval, Rules: []apiRule{}}
		for _, rs := range g.rules {
			rl := rs.rule
			if (typ == "alert" && rl.Alert == "") || (typ == "record" && rl.Record == "") {
				continue
			}
			ar := apiRule{Name: rl.Name(), Query: rl.Expr, Labels: rl.Labels.Map(), Health: rs.health,
				EvaluationTime: rs.evalDur.Seconds(), LastEvaluation: rs.lastEval, Type: "recording"}
			if rs.lastErr != nil {
				ar.LastError = rs.lastErr.Error()
			}
			if rl.Alert != "" {
				ar.Type, ar.State = "alerting", rs.alerts.state().String()
				ar.Duration, ar.KeepFiringFor = rl.For.Seconds(), rl.KeepFiringFor.Seconds()
				ar.Annotations = rl.Annotations.Map()
				ar.Alerts = alertsOf(rs, p)
			}
			ag.Rules = append(ag.Rules, ar)
		}
		g.mu.Unlock()
		if len(ag.Rules) > 0 || typ == "" {
			groups = append(groups, ag)
		}
	}
	writeJSON(w, map[string]any{"groups": groups})
}

func writeJSON(w http.ResponseWriter, data any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": data})
}
