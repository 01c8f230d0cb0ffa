package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/rules"
	"github.com/telemetryd/telemetryd/ingest/ownership"
)

// webhookSink is a plain webhook receiver (-alert-webhook-url) that
// keeps every alert it is sent, with when it came.
type webhookSink struct {
	mu  sync.Mutex
	got []sunkAlert
}

type sunkAlert struct {
	at       time.Time
	name     string
	status   string
	startsAt time.Time
	labels   map[string]string
}

func newWebhookSink(t *testing.T) (*webhookSink, string) {
	t.Helper()
	s := &webhookSink{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Alerts []struct {
				Labels   map[string]string `json:"labels"`
				Status   string            `json:"status"`
				StartsAt time.Time         `json:"startsAt"`
			} `json:"alerts"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		for _, a := range body.Alerts {
			s.got = append(s.got, sunkAlert{at: time.Now(), name: a.Labels["alertname"], status: a.Status,
				startsAt: a.StartsAt, labels: a.Labels})
		}
		s.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return s, srv.URL
}

// of returns the alerts named name received with status.
func (s *webhookSink) of(name, status string) []sunkAlert {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sunkAlert
	for _, a := range s.got {
		if a.name == name && a.status == status {
			out = append(out, a)
		}
	}
	return out
}

// groupLastEval is when node base last evaluated the group named name
// (zero when never), from its /api/v1/rules.
func groupLastEval(base, name string) time.Time {
	resp, err := http.Get(base + "/api/v1/rules")
	if err != nil {
		return time.Time{}
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Groups []struct {
				Name           string    `json:"name"`
				LastEvaluation time.Time `json:"lastEvaluation"`
			} `json:"groups"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil {
		return time.Time{}
	}
	for _, g := range body.Data.Groups {
		if g.Name == name {
			return g.LastEvaluation
		}
	}
	return time.Time{}
}

// apiAlertOf returns node base's alert named name from /api/v1/alerts.
func apiAlertOf(base, name string) (state string, activeAt time.Time, ok bool) {
	resp, err := http.Get(base + "/api/v1/alerts")
	if err != nil {
		return "", time.Time{}, false
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Alerts []struct {
				Labels   map[string]string `json:"labels"`
				State    string            `json:"state"`
				ActiveAt time.Time         `json:"activeAt"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil {
		return "", time.Time{}, false
	}
	for _, a := range body.Data.Alerts {
		if a.Labels["alertname"] == name {
			return a.State, a.ActiveAt, true
		}
	}
	return "", time.Time{}, false
}

// evaluatedAt returns the evaluation times of the rule named alert on
// node m: the points of its ALERTS series that m keeps in memory, one
// per evaluation while the alert is active.
func evaluatedAt(t *testing.T, m *Main, alert string) []time.Time {
	t.Helper()
	q, err := m.alerts.Manager.Series().Querier(0, 1<<62)
	require.NoError(t, err)
	defer q.Close()
	set := q.Select(context.Background(), true, nil,
		labels.MustNewMatcher(labels.MatchEqual, model.MetricNameLabel, rules.AlertsName),
		labels.MustNewMatcher(labels.MatchEqual, "alertname", alert))
	var out []time.Time
	for set.Next() {
		it := set.At().Iterator(nil)
		for it.Next() != 0 {
			ts, _ := it.At()
			out = append(out, time.UnixMilli(ts).UTC())
		}
	}
	require.NoError(t, set.Err())
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return slices.Compact(out)
}

// TestClusterAlertsTakeover runs three telemetryd nodes on a three-server
// NATS cluster with one rule group and a webhook receiver. The group is
// evaluated by one node at a time; when that node is killed (its NATS
// connection drops first, so its leases lapse rather than being
// released) another takes the group over within the lease TTL plus one
// interval, restores its state from the bucket (a pending alert keeps
// its activeAt and fires when its for has passed since then) and sends
// no firing alert again before its resend delay, but for at most one
// re-send of what the killed node may have sent without saving.
func TestClusterAlertsTakeover(t *testing.T) {
	inLane(t, lanes.cluster)
	const (
		interval = time.Second
		forDur   = 10 * time.Second
		ttl      = 2 * time.Second
	)
	dir := t.TempDir()
	ruleFile := filepath.Join(dir, "fleet.yml")
	require.NoError(t, os.WriteFile(ruleFile, []byte(fmt.Sprintf(`groups:
  - name: fleet
    interval: %s
    rules:
      - alert: Heartbeat
        expr: vector(1)
      - alert: FreezerWarm
        expr: max by (device) (freezer_temp) > -15
        for: %s
`, interval, forDur)), 0o644))
	sink, hookURL := newWebhookSink(t)

	nc := startNATSCluster(t, 3)
	nodes := startConvergedNodes(t, nc, 3, 2, func(cfg *Config) {
		cfg.Cluster.LeaseTTL = ttl
		cfg.Alerting.Rules = ruleFile
		cfg.Alerting.Webhooks = []string{hookURL}
	})
	mains := make([]*Main, len(nodes))
	for i, n := range nodes {
		mains[i] = n.main()
	}

	// The evaluating node is the one whose last evaluation is newest
	// once every node has been up for a few intervals.
	holder := func(among []int) int {
		best, bestAt := -1, time.Time{}
		for _, i := range among {
			if at := groupLastEval(nodes[i].base, "fleet"); at.After(bestAt) {
				best, bestAt = i, at
			}
		}
		return best
	}
	var hot int
	waitFor(t, 100*time.Millisecond, func() bool {
		hot = holder([]int{0, 1, 2})
		return hot >= 0 && len(sink.of("Heartbeat", "firing")) > 0
	}, "no node evaluates the group")

	// A freezer warms up: the alert is pending on the evaluating node.
	s := &testService{base: nodes[0].base}
	writeLine(t, s, "freezer,device=freezer-1 temp=-3", mains[0].now())
	var activeAt time.Time
	waitFor(t, 50*time.Millisecond, func() bool {
		hot = holder([]int{0, 1, 2})
		st, at, ok := apiAlertOf(nodes[hot].base, "FreezerWarm")
		activeAt = at
		return ok && st == "pending"
	}, "the alert never became pending")
	victim := nodes[hot]
	t.Logf("%s evaluates the group; FreezerWarm pending since %s", victim.cfg.Cluster.NodeName, activeAt.Format(time.TimeOnly))

	// The victim's last lease renewal, as the others see it.
	js := jsFor(t, nc.url(0))
	leases, err := js.KeyValue(context.Background(), ownership.DefaultBucket)
	require.NoError(t, err)
	victim.crash()
	e, err := leases.Get(context.Background(), "nodes."+victim.cfg.Cluster.NodeName)
	require.NoError(t, err)
	var lease ownership.Lease
	require.NoError(t, json.Unmarshal(e.Value(), &lease))
	killedAt := mains[hot].now()
	var survivors []int
	for i := range nodes {
		if i != hot {
			survivors = append(survivors, i)
		}
	}

	// Another node fires the alert, from the pending state the killed
	// node saved.
	var next int
	var firingAt time.Time
	waitFor(t, 50*time.Millisecond, func() bool {
		next = holder(survivors)
		if next < 0 {
			return false
		}
		st, at, ok := apiAlertOf(nodes[next].base, "FreezerWarm")
		firingAt = at
		return ok && st == "firing"
	}, "no survivor fired the alert")
	assert.True(t, firingAt.Equal(activeAt), "the alert's activeAt %s, pending since %s: its for state was lost in the takeover", firingAt, activeAt)
	var fired []sunkAlert
	waitFor(t, 50*time.Millisecond, func() bool {
		fired = sink.of("FreezerWarm", "firing")
		return len(fired) > 0
	}, "the webhook never got the firing alert")
	firedAt := fired[0].startsAt
	t.Logf("FreezerWarm fired at %s, %s after it became pending (for %s), %s after the kill",
		firedAt.Format(time.TimeOnly), firedAt.Sub(activeAt), forDur, firedAt.Sub(killedAt).Round(time.Millisecond))
	assert.GreaterOrEqual(t, firedAt.Sub(activeAt), forDur, "fired before its for")
	assert.True(t, firedAt.Before(killedAt.Add(forDur)), "fired at %s, a for after the takeover rather than after it became pending (%s)", firedAt, activeAt)

	// Exactly one node at a time: no evaluation time was evaluated by
	// two nodes (Heartbeat is active at every evaluation).
	byTime := map[time.Time][]string{}
	var firstAfter time.Time
	lastBefore := time.Time{}
	for i, m := range mains {
		for _, at := range evaluatedAt(t, m, "Heartbeat") {
			byTime[at] = append(byTime[at], nodes[i].cfg.Cluster.NodeName)
			if i == hot && at.After(lastBefore) {
				lastBefore = at
			}
			if i == next && at.After(lease.Renewed) && (firstAfter.IsZero() || at.Before(firstAfter)) {
				firstAfter = at
			}
		}
	}
	for at, who := range byTime {
		assert.Len(t, who, 1, "evaluation at %s by %v", at.Format(time.TimeOnly+".000"), who)
	}
	require.False(t, firstAfter.IsZero())
	t.Logf("the killed node last renewed its lease at %s and evaluated at %s; %s evaluated next at %s: %s after the renewal (lease TTL %s, interval %s), %s after the kill",
		lease.Renewed.Format(time.TimeOnly+".000"), lastBefore.Format(time.TimeOnly+".000"), nodes[next].cfg.Cluster.NodeName,
		firstAfter.Format(time.TimeOnly+".000"), firstAfter.Sub(lease.Renewed).Round(time.Millisecond), ttl, interval,
		firstAfter.Sub(killedAt).Round(time.Millisecond))
	// The group's entry is renewed at every evaluation and keeps the
	// group for a lease TTL (a node that has not seen the holder yet
	// must not take it), so the bound runs from the later of the two.
	last := lease.Renewed
	if lastBefore.After(last) {
		last = lastBefore
	}
	assert.LessOrEqual(t, firstAfter.Sub(last), ttl+interval, "the group was not evaluated again within the lease TTL plus one interval of the killed node's last renewal or evaluation")

	hb, early := assertOneAlertResentAtMostOnce(t, sink, "Heartbeat")
	assert.Len(t, sink.of("FreezerWarm", "firing"), 1, "FreezerWarm sent more than once")
	t.Logf("webhook: Heartbeat %d times (%d sooner than the resend delay), FreezerWarm firing once", len(hb), early)
}

// assertOneAlertResentAtMostOnce checks the firing notifications of
// alert a sink got across a takeover: the same alert throughout (its
// startsAt kept across nodes), and at most one sooner than the resend
// delay after the one before (what a killed node may have sent without
// saving it). It returns them and how many came early.
func assertOneAlertResentAtMostOnce(t *testing.T, sink *webhookSink, alert string) ([]sunkAlert, int) {
	t.Helper()
	got := sink.of(alert, "firing")
	early := 0
	for i := 1; i < len(got); i++ {
		assert.True(t, got[i].startsAt.Equal(got[0].startsAt), "%s re-sent as a new alert: startsAt %s, first %s", alert, got[i].startsAt, got[0].startsAt)
		if got[i].at.Sub(got[i-1].at) < rules.DefaultResendDelay {
			early++
		}
	}
	assert.LessOrEqual(t, early, 1, "%s sent %d times sooner than its resend delay", alert, early)
	return got, early
}
