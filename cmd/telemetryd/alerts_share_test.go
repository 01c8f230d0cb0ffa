package main

import (
	"net/http"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestExpensiveRuleCannotStarveQueries: the rules query the engine
// with their own share (-rule-query-slots), apart from the API's. A
// rule far past its evaluation interval (a range function over a
// subquery of 7,000 steps, each the median of 7,000 points: about 6
// CPU seconds uncut) holds the only rule slot, and while it does, API
// queries answer, and so do /api/v1/rules and /api/v1/alerts; the
// rule itself is stopped by its timeout, one interval (1 s), and
// reports the error on /api/v1/rules. That the engine stops within a
// step of the subquery, not after it, is promapi's
// TestQueryStopsAtItsContext.
func TestExpensiveRuleCannotStarveQueries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hog.yml")
	writeRulesFile(t, path, `groups:
  - name: hog
    interval: 1s
    rules:
      - alert: Hog
        expr: max_over_time(quantile_over_time(0.5, vector(time())[7000s:1s])[7000s:1s]) > 0
`)
	cfg := newTestConfig(t)
	cfg.Alerting.EvalSlots = 1
	s := rulesService(t, cfg, path, nil)
	s.publish(t, "d1", tempReading(s.now(), 21))
	waitStored(t, s, "d1", 1) // acked is stored, and queryable once the ingester committed it
	m := s.Main.alerts.Manager

	t0 := time.Now()
	answered := 0
	for tries := 0; answered < 5; tries++ {
		require.Less(t, tries, 15, "answers came only while the rule slot was free")
		waitFor(t, time.Millisecond, func() bool { return m.SlotsInUse() == 1 },
			"the expensive rule never took its slot")
		got := s.promQuery(t, "/api/v1/query", url.Values{"query": {`temp{device="d1"}`}, "time": {promTime(s.now())}})
		s.rules(t)
		s.alerts(t)
		held := m.SlotsInUse() == 1
		require.Len(t, got, 1)
		_, v := pointValue(t, got[0].Value)
		assert.Equal(t, 21.0, v)
		if held {
			answered++ // asked and answered while the rule held the slot
		}
	}

	t.Logf("answered at %s", time.Since(t0))
	var lastErr string
	waitFor(t, 100*time.Millisecond, func() bool {
		r := s.rules(t)
		if len(r.Groups) == 1 && len(r.Groups[0].Rules) == 1 {
			lastErr = r.Groups[0].Rules[0].LastError
		}
		return lastErr != ""
	}, "the expensive rule is cut by the limits")
	assert.Contains(t, lastErr, "query timed out")
	t.Logf("rule error at %s: %s", time.Since(t0), lastErr)
	code, body := s.get(t, "/readyz", nil)
	assert.Equal(t, http.StatusOK, code, body)
}
