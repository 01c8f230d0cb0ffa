package promapi

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// errorKeys decodes an error answer and returns its keys, sorted.
func errorKeys(t *testing.T, body []byte) []string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(body, &m), "%s", body)
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Every error answer spells its keys as Prometheus does: errorType, not
// ErrorType. Go's decoder would read either; Grafana's browser side
// reads only the first.
func TestErrorAnswersSpellErrorType(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	a, err := New(Config{Source: newCountingSource(11, now), MaxSeries: 10, Now: func() time.Time { return now }})
	require.NoError(t, err)
	for _, tc := range []struct {
		path   string
		status int
		typ    string
	}{
		{"/api/v1/query?query=temp{", http.StatusBadRequest, "bad_data"},
		{"/api/v1/query?query=temp", http.StatusUnprocessableEntity, "execution"},
	} {
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		require.Equal(t, tc.status, rec.Code, "%s: %s", tc.path, rec.Body)
		assert.Equal(t, []string{"error", "errorType", "status"}, errorKeys(t, rec.Body.Bytes()), tc.path)
		assert.Contains(t, rec.Body.String(), `"errorType":"`+tc.typ+`"`)
	}

	rec := httptest.NewRecorder()
	WriteError(rec, http.StatusTooManyRequests, ErrorUnavailable, "too many queries")
	assert.JSONEq(t, `{"status":"error","errorType":"unavailable","error":"too many queries"}`, rec.Body.String())

	// An answer that cannot be encoded falls back to a fixed one, in the
	// same shape.
	rec = httptest.NewRecorder()
	write(rec, http.StatusOK, response{Status: "success", Data: math.NaN()})
	assert.Equal(t, http.StatusInternalServerError, rec.Code)
	assert.JSONEq(t, `{"status":"error","errorType":"internal","error":"cannot encode the answer"}`, rec.Body.String())
}
