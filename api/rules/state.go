package rules

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	"github.com/prometheus/prometheus/model/labels"
)

// savedState is a group's alert state as StateStore keeps it.
type savedState struct {
	// Saved is when it was written: state older than the outage
	// tolerance is not restored.
	Saved time.Time   `json:"saved"`
	Rules []savedRule `json:"rules"`
}

type savedRule struct {
	Key    string       `json:"key"`
	Alerts []savedAlert `json:"alerts"`
}

type savedAlert struct {
	Labels          map[string]string `json:"labels"`
	Annotations     map[string]string `json:"annotations,omitempty"`
	State           string            `json:"state"`
	Value           float64           `json:"value"`
	ActiveAt        time.Time         `json:"activeAt"`
	FiredAt         time.Time         `json:"firedAt,omitzero"`
	LastSentAt      time.Time         `json:"lastSentAt,omitzero"`
	KeepFiringSince time.Time         `json:"keepFiringSince,omitzero"`
	ValidUntil      time.Time         `json:"validUntil,omitzero"`
}

// stateKey is the StateStore key of a group.
func (g *group) stateKey() string { return g.spec.Key() }

// save writes the group's alerts when they changed, or when the last
// save is older than saveEvery. A failure is logged; the next
// evaluation tries again.
func (g *group) save(ctx context.Context, ts time.Time) {
	st := g.m.cfg.States
	if st == nil {
		return
	}
	var s savedState
	for _, r := range g.rules {
		if r.rule.Alert == "" || len(r.alerts.active) == 0 {
			continue
		}
		sr := savedRule{Key: ruleKey(r.rule)}
		for _, a := range r.alerts.active {
			if a.State == StateInactive {
				continue
			}
			sr.Alerts = append(sr.Alerts, savedAlert{Labels: a.Labels.Map(), Annotations: a.Annotations.Map(),
				State: a.State.String(), Value: a.Value, ActiveAt: a.ActiveAt, FiredAt: a.FiredAt, LastSentAt: a.LastSentAt,
				KeepFiringSince: a.KeepFiringSince, ValidUntil: a.ValidUntil})
		}
		s.Rules = append(s.Rules, sr)
	}
	body, err := json.Marshal(s.Rules)
	if err != nil {
		return
	}
	if bytes.Equal(body, g.saved) && ts.Sub(g.lastSave) < saveEvery {
		return
	}
	s.Saved = ts
	b, err := json.Marshal(s)
	if err != nil {
		return
	}
	if err := st.Save(ctx, g.stateKey(), b); err != nil {
		if ctx.Err() == nil {
			g.m.log.Warn("alert state not saved", "group", g.spec.Name, "err", err)
		}
		return
	}
	g.saved, g.lastSave = body, ts
}

// restore loads the saved alerts of the group's rules, unless they are
// older than the outage tolerance: a pending alert keeps its activeAt,
// so it fires when its for has passed since it became pending, not a
// for after the restart; a firing one keeps when it was last sent, so
// it is not sent again before its resend delay.
func (g *group) restore(ctx context.Context, ts time.Time) {
	st := g.m.cfg.States
	if st == nil {
		return
	}
	b, err := st.Load(ctx, g.stateKey())
	if err != nil {
		g.m.log.Warn("alert state not restored", "group", g.spec.Name, "err", err)
		return
	}
	if b == nil {
		return
	}
	var s savedState
	if err := json.Unmarshal(b, &s); err != nil {
		g.m.log.Warn("alert state not restored: unreadable", "group", g.spec.Name, "err", err)
		return
	}
	if ts.Sub(s.Saved) > g.m.cfg.OutageTolerance {
		g.m.log.Info("alert state not restored: older than the outage tolerance", "group", g.spec.Name,
			"saved", s.Saved, "tolerance", g.m.cfg.OutageTolerance)
		return
	}
	byKey := map[string]savedRule{}
	for _, r := range s.Rules {
		byKey[r.Key] = r
	}
	n := 0
	for _, r := range g.rules {
		sr, ok := byKey[ruleKey(r.rule)]
		if !ok || r.rule.Alert == "" {
			continue
		}
		r.alerts.active = map[uint64]*Alert{}
		for _, a := range sr.Alerts {
			state := StatePending
			if a.State == StateFiring.String() {
				state = StateFiring
			}
			lset := labels.FromMap(a.Labels)
			r.alerts.active[lset.Hash()] = &Alert{Labels: lset, Annotations: labels.FromMap(a.Annotations), State: state,
				Value: a.Value, ActiveAt: a.ActiveAt, FiredAt: a.FiredAt, LastSentAt: a.LastSentAt,
				KeepFiringSince: a.KeepFiringSince, ValidUntil: a.ValidUntil}
			n++
		}
	}
	g.saved, g.lastSave = nil, time.Time{}
	if n > 0 {
		g.m.log.Info("alert state restored", "group", g.spec.Name, "alerts", n, "saved", s.Saved)
	}
}
