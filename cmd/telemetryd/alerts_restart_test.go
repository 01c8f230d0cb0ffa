package main

import (
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAlertRestartDuringFor: an alert pending when the service stops
// is restored when it starts again on the same data dir, and fires at
// its original activeAt + for, not `for` after the restart. The clock
// runs on through the restart, as a real one does.
func TestAlertRestartDuringFor(t *testing.T) {
	inLane(t, lanes.general)
	const forDur = 8 * time.Second
	path := filepath.Join(t.TempDir(), "hot.yml")
	writeRulesFile(t, path, `groups:
  - name: hot
    interval: 1s
    rules:
      - alert: Hot
        expr: temp > 30
        for: 8s
`)
	cfg := newTestConfig(t)
	clock := testClock()
	s := rulesService(t, cfg, path, clock)
	s.publish(t, "oven-1", tempReading(clock(), 250))

	var pending promAlert
	waitFor(t, 20*time.Millisecond, func() bool {
		as := s.alerts(t)
		if len(as) == 1 {
			pending = as[0]
		}
		return len(as) == 1
	}, "the alert never went pending")
	require.Equal(t, "pending", pending.State)
	activeAt := pending.ActiveAt
	s.stop(t)
	time.Sleep(2 * time.Second) // well into `for`, with no evaluation

	s = rulesService(t, cfg, path, clock)
	restartAt := clock()
	t.Logf("pending at %s, restarted %s after", activeAt.Format(time.RFC3339Nano), restartAt.Sub(activeAt))
	var firing promAlert
	waitFor(t, 20*time.Millisecond, func() bool {
		as := s.alerts(t)
		if len(as) == 1 {
			firing = as[0]
		}
		return len(as) == 1 && firing.State == "firing"
	}, "the alert never fired after the restart")
	assert.True(t, activeAt.Equal(firing.ActiveAt), "activeAt restored: %s, was %s", firing.ActiveAt, activeAt)

	// The first firing evaluation, from the ALERTS series of the
	// restarted service, at most one second apart.
	end := clock().Add(time.Second) // past the evaluation that fired
	rng := s.promQuery(t, "/api/v1/query_range", url.Values{"query": {`ALERTS{alertname="Hot",alertstate="firing"}`},
		"start": {promTime(restartAt.Add(-time.Second))}, "end": {promTime(end)}, "step": {"0.05"}})
	require.Len(t, rng, 1)
	require.NotEmpty(t, rng[0].Values)
	firstStep, _ := pointValue(t, rng[0].Values[0])
	t.Logf("first firing step %s: %s after activeAt, %s after the restart", firstStep.Format(time.RFC3339Nano),
		firstStep.Sub(activeAt), firstStep.Sub(restartAt))
	// The evaluation that fired is at most one step (50 ms) before the
	// first step that shows it.
	// Samples carry milliseconds and activeAt nanoseconds: the step may
	// read up to a millisecond under activeAt + for.
	assert.GreaterOrEqual(t, firstStep.Sub(activeAt), forDur-time.Millisecond, "fired before activeAt + for")
	assert.Less(t, firstStep.Sub(restartAt), forDur, "fired `for` after the restart, not at activeAt + for")

	at := promTime(end)
	got := s.promQuery(t, "/api/v1/query", url.Values{"query": {`ALERTS_FOR_STATE{alertname="Hot"}`}, "time": {at}})
	require.Len(t, got, 1)
	_, v := pointValue(t, got[0].Value)
	assert.Equal(t, float64(activeAt.Unix()), v, "ALERTS_FOR_STATE keeps the original activeAt")
}
