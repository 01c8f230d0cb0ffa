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
// rule that takes its whole evaluation interval (two nested subqueries
// of 7,000 steps each: about 2.5 CPU seconds, cut by the timeout of one
// interval, 1 s, as soon as the engine looks at it) holds the only rule slot,
// and while it does, API queries answer, and so do /api/v1/rules and
// /api/v1/alerts.
func TestExpensiveRuleCannotStarveQueries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hog.yml")
	writeRulesFile(t, path, `groups:
  - name: hog
    interval: 1s
    rules:
      - alert: Hog
        expr: max_over_time(max_over_time(vector(1)[7000s:1s])[7000s:1s]) > 0
`)
	cfg := newTestConfig(t)
	cfg.Alerting.EvalSlots = 1
	s := rulesService(t, cfg, path, nil)
	s.publish(t, "d1", tempReading(s.now(), 21))
	m := s.Main.alerts.Manager

	t0 := time.Now()
	answered := 0
	for tries := 0; answered < 5; tries++ {
		require.Less(t, tries, 15, "answers came only while the rule slot was free")
		require.Eventually(t, func() bool { return m.SlotsInUse() == 1 }, 30*time.Second, time.Millisecond,
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
	// Whether the rule is then cut by its timeout is not asserted: the
	// engine checks its deadline between steps, and these nested
	// subqueries over vector(1) can run past it (api/rules/README.md).
	code, body := s.get(t, "/readyz", nil)
	assert.Equal(t, http.StatusOK, code, body)
}
