package rules

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/template"
)

// State is an alert's or an alerting rule's state.
type State int

// The states, as Prometheus names them.
const (
	StateInactive State = iota
	StatePending
	StateFiring
)

func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateFiring:
		return "firing"
	}
	return "inactive"
}

// Alert is one alert of an alerting rule: one series of its result,
// with the rule's labels and annotations applied.
type Alert struct {
	Labels      labels.Labels
	Annotations labels.Labels
	State       State
	Value       float64
	// ActiveAt is when the alert became pending; FiredAt when it fired;
	// ResolvedAt when it stopped; LastSentAt when it was last sent;
	// KeepFiringSince when its series went while keep_firing_for held
	// it; ValidUntil the endsAt of the last firing notification.
	ActiveAt, FiredAt, ResolvedAt, LastSentAt, KeepFiringSince, ValidUntil time.Time
}

// alertNameLabel and alertStateLabel are the labels Prometheus gives
// alerts and the ALERTS series.
const (
	alertNameLabel  = "alertname"
	alertStateLabel = "alertstate"
)

// MaxAlertsPerRule bounds the alerts one rule may hold; a rule beyond
// it (or beyond its group's limit) fails its evaluation, as Prometheus'
// limit does.
const MaxAlertsPerRule = 20000

// expander expands a rule's label and annotation templates for one
// sample of its result.
type expander struct {
	ctx      context.Context
	rule     *Rule
	ts       time.Time
	query    template.QueryFunc
	external map[string]string
	url      *url.URL
}

// templateDefs are the variables every template may use, as in
// Prometheus.
const templateDefs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"

// expand expands text with the sample's labels and value; an error is
// shown in the result, as Prometheus does.
func (e *expander) expand(text string, smpl promql.Sample) string {
	if !strings.Contains(text, "{{") {
		return text
	}
	extURL := ""
	if e.url != nil {
		extURL = e.url.String()
	}
	data := template.AlertTemplateData(smpl.Metric.Map(), e.external, extURL, smpl)
	t := template.NewTemplateExpander(e.ctx, templateDefs+text, "__alert_"+e.rule.Alert, data,
		model.Time(e.ts.UnixMilli()), e.query, e.url, nil)
	out, err := t.Expand()
	if err != nil {
		return fmt.Sprintf("<error expanding template: %s>", err)
	}
	return out
}

// alertingState is an alerting rule's alerts between evaluations.
type alertingState struct {
	active map[uint64]*Alert
}

// evalAlerting applies one evaluation's result res at ts to the rule's
// alerts (Prometheus' semantics: pending, firing after for, held by
// keep_firing_for, resolved when its series goes). groupLabels are
// added to the rule's labels (the rule's win).
func (st *alertingState) eval(r *Rule, groupLabels labels.Labels, res promql.Vector, ts time.Time, limit int, ex *expander) error {
	if st.active == nil {
		st.active = map[uint64]*Alert{}
	}
	seen := make(map[uint64]struct{}, len(res))
	fresh := make(map[uint64]*Alert, len(res))
	lb := labels.NewBuilder(labels.EmptyLabels())
	ab := labels.NewBuilder(labels.EmptyLabels())
	for _, smpl := range res {
		lb.Reset(smpl.Metric)
		lb.Del(model.MetricNameLabel)
		groupLabels.Range(func(l labels.Label) {
			if !r.Labels.Has(l.Name) {
				lb.Set(l.Name, ex.expand(l.Value, smpl))
			}
		})
		r.Labels.Range(func(l labels.Label) { lb.Set(l.Name, ex.expand(l.Value, smpl)) })
		lb.Set(alertNameLabel, r.Alert)
		ab.Reset(labels.EmptyLabels())
		r.Annotations.Range(func(l labels.Label) { ab.Set(l.Name, ex.expand(l.Value, smpl)) })
		lset := lb.Labels()
		fp := lset.Hash()
		if _, dup := fresh[fp]; dup {
			return fmt.Errorf("vector contains metrics with the same labelset after applying alert labels: %s", lset)
		}
		fresh[fp] = &Alert{Labels: lset, Annotations: ab.Labels(), Value: smpl.F, State: StatePending, ActiveAt: ts}
	}
	for fp, a := range fresh {
		seen[fp] = struct{}{}
		if old, ok := st.active[fp]; ok && old.State != StateInactive {
			old.Value, old.Annotations, old.Labels = a.Value, a.Annotations, a.Labels
			old.KeepFiringSince = time.Time{}
			continue
		}
		st.active[fp] = a
	}
	n := 0
	for fp, a := range st.active {
		if _, ok := seen[fp]; !ok {
			keep := false
			if a.State == StateFiring && r.KeepFiringFor > 0 {
				if a.KeepFiringSince.IsZero() {
					a.KeepFiringSince = ts
				}
				keep = ts.Sub(a.KeepFiringSince) < r.KeepFiringFor
			}
			if a.State == StatePending {
				delete(st.active, fp)
				continue
			}
			if a.State == StateFiring && !keep {
				a.State, a.ResolvedAt = StateInactive, ts
			}
			if !keep {
				continue
			}
		}
		if a.State == StatePending && ts.Sub(a.ActiveAt) >= r.For {
			a.State, a.FiredAt = StateFiring, ts
		}
		n++
	}
	if limit <= 0 || limit > MaxAlertsPerRule {
		limit = MaxAlertsPerRule
	}
	if n > limit {
		clear(st.active)
		return fmt.Errorf("exceeded limit of %d with %d alerts", limit, n)
	}
	return nil
}

// state is the rule's state: the highest of its alerts'.
func (st *alertingState) state() State {
	s := StateInactive
	for _, a := range st.active {
		s = max(s, a.State)
	}
	return s
}

// needsSending says whether a is sent at ts: a firing alert when it was
// never sent or resendDelay has passed since, a resolved one once.
func (a *Alert) needsSending(ts time.Time, resendDelay time.Duration) bool {
	switch a.State {
	case StatePending:
		return false
	case StateInactive:
		return a.ResolvedAt.After(a.LastSentAt) && !a.FiredAt.IsZero()
	}
	return a.LastSentAt.IsZero() || !a.LastSentAt.Add(resendDelay).After(ts)
}
