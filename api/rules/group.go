package rules

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/template"

	"github.com/telemetryd/telemetryd/buckets"
)

// Rule health, as Prometheus reports it.
const (
	healthUnknown = "unknown"
	healthOK      = "ok"
	healthErr     = "err"
)

// group is a running group: its rules' state and its ticker.
type group struct {
	m    *Manager
	spec *Group

	eval     sync.Mutex // one evaluation at a time
	mu       sync.Mutex // guards everything below, held only while it changes
	rules    []*ruleState
	lastEval time.Time
	evalDur  time.Duration
	// restored is set once this node has loaded the saved state since
	// it took the group (lease).
	restored bool
	held     bool
	lastSave time.Time
	saved    []byte

	stop chan struct{}
	done chan struct{}
}

// ruleState is one rule's evaluation state.
type ruleState struct {
	rule     *Rule
	alerts   alertingState
	health   string
	lastErr  error
	lastEval time.Time
	evalDur  time.Duration
	// thr is set for an alerting rule that compares a vector with a
	// number: it shares the vector with the group's other such rules.
	thr *threshold
}

func newGroup(m *Manager, spec *Group) *group {
	g := &group{m: m, spec: spec}
	var thrs []*threshold
	for _, r := range spec.Rules {
		rs := &ruleState{rule: r, health: healthUnknown}
		if r.Alert != "" {
			if rs.thr = thresholdOf(r.Expr); rs.thr != nil {
				thrs = append(thrs, rs.thr)
			}
		}
		g.rules = append(g.rules, rs)
	}
	shareOperands(thrs)
	return g
}

// inherit takes the alerts of o's rules that g keeps unchanged.
func (g *group) inherit(o *group) {
	o.stopAndWait()
	o.mu.Lock()
	defer o.mu.Unlock()
	byKey := map[string]*ruleState{}
	for _, r := range o.rules {
		byKey[ruleKey(r.rule)] = r
	}
	for _, r := range g.rules {
		if p, ok := byKey[ruleKey(r.rule)]; ok && r.rule.Alert != "" {
			r.alerts = p.alerts
		}
	}
	g.restored, g.held = o.restored, o.held
}

// ruleKey identifies an alerting rule's alerts across reloads, restarts
// and nodes.
func ruleKey(r *Rule) string { return r.Name() + "\x00" + r.Expr }

// start runs the group's ticker until stopAndWait.
func (g *group) start(ctx context.Context) {
	g.stop, g.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(g.done)
		g.run(ctx)
	}()
}

func (g *group) stopAndWait() {
	if g.done == nil {
		return
	}
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	<-g.done
}

// offset spreads the groups over their interval: a group's evaluations
// are at multiples of its interval plus a fixed offset from its key, as
// in Prometheus.
func (g *group) offset() time.Duration {
	h := fnv.New64a()
	h.Write([]byte(g.spec.Key()))
	return time.Duration(h.Sum64() % uint64(g.spec.Interval))
}

// next is the first evaluation time after now.
func (g *group) next(now time.Time) time.Time {
	iv := g.spec.Interval
	t := now.Truncate(iv).Add(g.offset())
	for !t.After(now) {
		t = t.Add(iv)
	}
	return t
}

func (g *group) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-g.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		now := g.m.cfg.Now()
		at := g.next(now)
		t := time.NewTimer(at.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		g.tick(ctx, at)
	}
}

// tick evaluates the group at ts if this node holds its lease. The
// queries run without g.mu, so the rules and alerts API answers while
// an expensive rule evaluates; g.mu is taken to change the state.
func (g *group) tick(ctx context.Context, ts time.Time) {
	g.eval.Lock()
	defer g.eval.Unlock()
	if !g.takeLease(ctx, ts) {
		return
	}
	start := time.Now()
	var sends []Notification
	batch, ops := g.batch(ctx), operands{}
	for _, r := range g.rules {
		sends = append(sends, g.evalRule(batch, ops, r, ts)...)
		if r.rule.Record != "" { // the rules after it read what it wrote
			batch, ops = g.batch(ctx), operands{}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lastEval, g.evalDur = ts, time.Since(start)
	if len(sends) > 0 && g.m.cfg.Sender != nil {
		g.m.cfg.Sender.Send(sends)
	}
	g.save(ctx, ts)
}

// batch is the context of the queries of one batch (Config.Batch).
func (g *group) batch(ctx context.Context) context.Context {
	if g.m.cfg.Batch == nil {
		return ctx
	}
	return g.m.cfg.Batch(ctx)
}

// takeLease reports whether this node evaluates the group now, and
// restores its saved state when the node has just taken it.
func (g *group) takeLease(ctx context.Context, ts time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if l := g.m.cfg.Lease; l != nil && !l(g.spec.Key()) {
		if g.held {
			g.m.log.Info("rule group evaluated by another node", "group", g.spec.Name)
		}
		g.held, g.restored = false, false
		return false
	}
	if !g.held && g.m.cfg.Lease != nil {
		g.m.log.Info("rule group evaluated here", "group", g.spec.Name)
	}
	g.held = true
	if !g.restored {
		g.restore(ctx, ts)
		g.restored = true
	}
	return true
}

// evalRule evaluates one rule at ts and returns the alerts to send.
func (g *group) evalRule(ctx context.Context, ops operands, r *ruleState, ts time.Time) []Notification {
	start := time.Now()
	qctx, cancel := context.WithTimeout(ctx, g.spec.Interval)
	defer cancel()
	err := g.m.acquire(qctx)
	if err == nil {
		err = g.evalWithSlot(qctx, ops, r, ts)
		g.m.release()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	r.lastEval, r.evalDur = ts, time.Since(start)
	if err != nil {
		if ctx.Err() == nil && (r.lastErr == nil || r.lastErr.Error() != err.Error()) {
			g.m.log.Warn("rule evaluation failed", "group", g.spec.Name, "rule", r.rule.Name(), "err", err)
		}
		r.health, r.lastErr = healthErr, err
	} else {
		r.health, r.lastErr = healthOK, nil
	}
	if r.rule.Alert == "" {
		return nil
	}
	return g.notifications(r, ts)
}

// evalWithSlot queries the rule's expression and records the result or
// updates the alerts (under g.mu; the templates expand there). A
// threshold rule is answered from its operand, shared through ops.
func (g *group) evalWithSlot(ctx context.Context, ops operands, r *ruleState, ts time.Time) error {
	var res promql.Vector
	var err error
	ok := false
	if r.thr != nil {
		res, ok, err = ops.query(ctx, g.m.cfg.Query, g.m.cfg.Keep, r.thr, ts)
	}
	if !ok {
		res, err = g.m.cfg.Query(ctx, r.rule.Expr, ts)
	}
	if err != nil {
		return err
	}
	if r.rule.Record != "" {
		return g.record(ctx, r.rule, res, ts)
	}
	ex := &expander{ctx: ctx, rule: r.rule, ts: ts, query: template.QueryFunc(g.m.cfg.Query), url: g.m.cfg.ExternalURL, external: g.m.cfg.ExternalLabels.Map()}
	g.mu.Lock()
	defer g.mu.Unlock()
	err = r.alerts.eval(r.rule, g.spec.Labels, res, ts, g.spec.Limit, ex)
	g.m.series.put(g.spec.Key(), r.rule, r.alerts.active, ts)
	return err
}

// record writes a recording rule's result at ts as readings: the value
// named by the rule, of the device its device label names.
func (g *group) record(ctx context.Context, r *Rule, res promql.Vector, ts time.Time) error {
	if g.m.cfg.Recorder == nil {
		return errors.New("recording rules are not enabled on this instance")
	}
	tk, err := buckets.TicksOf(ts)
	if err != nil {
		return err
	}
	dev := r.Labels.Get("device")
	if dev == "" {
		dev = g.spec.Labels.Get("device")
	}
	seen := map[string]bool{}
	rs := make([]buckets.Reading, 0, len(res))
	for _, s := range res {
		d := dev
		if d == "" {
			d = s.Metric.Get("device")
		}
		if d == "" {
			return fmt.Errorf("a result has no device label (%s); aggregate by device or give the rule labels: {device: NAME}", s.Metric)
		}
		if err := buckets.DeviceID(d).Validate(); err != nil {
			return fmt.Errorf("result %s: %w", s.Metric, err)
		}
		if seen[d] {
			return fmt.Errorf("several results for device %q; aggregate by device", d)
		}
		seen[d] = true
		if math.IsNaN(s.F) || math.IsInf(s.F, 0) || s.H != nil {
			continue
		}
		rs = append(rs, buckets.Reading{Device: buckets.DeviceID(d), Ticks: tk,
			Values: []buckets.Field{{Name: r.Record, Value: buckets.Float(s.F)}}})
	}
	if len(rs) == 0 {
		return nil
	}
	return g.m.cfg.Recorder.Record(ctx, rs)
}

// notifications marks and returns the rule's alerts due at ts, and
// forgets the resolved ones once sent.
func (g *group) notifications(r *ruleState, ts time.Time) []Notification {
	var out []Notification
	validity := 4 * max(g.spec.Interval, g.m.cfg.ResendDelay)
	for fp, a := range r.alerts.active {
		if a.needsSending(ts, g.m.cfg.ResendDelay) {
			a.LastSentAt = ts
			if a.State == StateFiring {
				a.ValidUntil = ts.Add(validity)
			}
			out = append(out, g.notification(r.rule, a))
		}
		if a.State == StateInactive {
			delete(r.alerts.active, fp)
		}
	}
	return out
}

func (g *group) notification(r *Rule, a *Alert) Notification {
	lb := labels.NewBuilder(a.Labels)
	g.m.cfg.ExternalLabels.Range(func(l labels.Label) {
		if !a.Labels.Has(l.Name) {
			lb.Set(l.Name, l.Value)
		}
	})
	n := Notification{Labels: lb.Labels(), Annotations: a.Annotations, StartsAt: a.FiredAt, EndsAt: a.ValidUntil,
		GeneratorURL: generatorURL(g.m.cfg.ExternalURL, r.Expr)}
	if a.State == StateInactive {
		n.EndsAt, n.Resolved = a.ResolvedAt, true
	}
	return n
}

// generatorURL links an alert to its expression on the built-in page.
func generatorURL(base *url.URL, expr string) string {
	if base == nil {
		return ""
	}
	u := *base
	u.Path = u.Path + "/ui/"
	u.RawQuery = url.Values{"q": {expr}}.Encode()
	return u.String()
}

// staleNaN marks the end of an ALERTS series, as Prometheus writes it.
var staleNaN = math.Float64frombits(value.StaleNaN)
