package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/blocked"
)

// A node whose /readyz names a damaged day table with the store's own
// repair advice is not waited for: waitReady says which days it
// advises repairing (the harness then repairs them offline). A node not
// ready for another reason is waited for as before.
func TestWaitReadyReportsTheAdvisedRepair(t *testing.T) {
	day := buckets.DayOfTime(time.Date(2026, 12, 6, 17, 11, 4, 0, time.UTC))
	reason := "readiness: lease not held"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]map[string]string{"error": {"message": reason}})
	}))
	t.Cleanup(srv.Close)
	sleeper := exec.Command("sleep", "60")
	require.NoError(t, sleeper.Start())
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	p := &proc{name: "node-1", cmd: sleeper, exited: make(chan struct{})}

	err := waitReady(t.Context(), p, srv.URL, time.Second)
	require.Error(t, err)
	var rn *repairNeeded
	assert.NotErrorAs(t, err, &rn, "not ready for another reason")

	reason = "readiness: store cannot commit: table " + day.String() + " cannot be opened (damaged?): " + blocked.RepairAdvice(day)
	err = waitReady(t.Context(), p, srv.URL, time.Minute)
	require.ErrorAs(t, err, &rn)
	assert.Equal(t, []string{"2026-12-06"}, rn.days)
}
