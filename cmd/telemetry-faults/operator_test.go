package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/blocked"
)

// A node whose /readyz names a damaged day table with the store's own
// repair advice gets that repair, once per advice, and the harness
// notes what it salvaged; a node not ready for another reason gets
// nothing posted.
func TestOperatorRunsTheAdvisedRepair(t *testing.T) {
	day := buckets.DayOfTime(time.Date(2026, 12, 6, 17, 11, 4, 0, time.UTC))
	var mu sync.Mutex
	damaged := true
	var posted []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/readyz" && damaged:
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "readiness: store cannot commit: table " + day.String() +
				" cannot be opened (damaged?): " + blocked.RepairAdvice(day)})
		case r.Method == http.MethodGet && r.URL.Path == "/readyz":
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "readiness: lease not held"})
		case r.Method == http.MethodPost:
			posted = append(posted, r.URL.Path)
			damaged = false
			_ = json.NewEncoder(w).Encode(map[string]any{"day": day.String(), "salvaged": 1200, "fromStream": 34, "badBlocks": 2})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	p := &proc{name: "node-1"}
	c := &cluster{nodes: []*proc{p}, urls: []string{srv.URL}}

	get := func() []byte {
		resp, err := http.Get(srv.URL + "/readyz")
		require.NoError(t, err)
		defer resp.Body.Close()
		var b json.RawMessage
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&b))
		return b
	}
	repairAdvised(t.Context(), p, srv.URL, get())
	repairAdvised(t.Context(), p, srv.URL, get()) // not damaged any more
	assert.Equal(t, []string{"/v1/tables/" + day.String() + "/repair"}, posted)
	notes := c.operatorNotes()
	require.Len(t, notes, 1)
	assert.Contains(t, notes[0], "node-1 advised /v1/tables/2026-12-06/repair")
	assert.Contains(t, notes[0], "1200 readings salvaged, 34 from the stream, 2 bad blocks")
	assert.Empty(t, c.operatorNotes(), "notes are taken once")
}
