package api_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

func mustDay(t *testing.T, s string) buckets.Day {
	t.Helper()
	d, err := buckets.ParseDay(s)
	require.NoError(t, err)
	return d
}

func TestTablesJSONShape(t *testing.T) {
	var gotTables []buckets.TableInfo
	var gotNow time.Time
	env := newTestEnv(t, func(c *api.Config) {
		// The policy's answer is reported as it is: day end + 48h for the
		// first table, "now" (dropped by a size cap) for the second.
		c.ExpiresAt = func(tables []buckets.TableInfo, now time.Time) []time.Time {
			gotTables, gotNow = tables, now
			return []time.Time{tables[0].Day.End().Time().Add(48 * time.Hour), now.In(time.FixedZone("x", 3600))}
		}
	})
	env.reader.tables = []buckets.TableInfo{
		{Day: mustDay(t, "2026-11-21"), SizeBytes: 1234, Readings: 56},
		{Day: mustDay(t, "2026-11-22"), SizeBytes: 99, Readings: -1},
	}
	res := env.get(t, "/v1/tables")
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	assert.JSONEq(t, `{"tables":[
		{"day":"2026-11-21","sizeBytes":1234,"readings":56,"expiresAt":"2026-11-24T00:00:00Z"},
		{"day":"2026-11-22","sizeBytes":99,"expiresAt":"`+env.clock.Now().UTC().Format(time.RFC3339Nano)+`"}]}`, string(res.body))
	assert.Equal(t, env.reader.tables, gotTables)
	assert.True(t, gotNow.Equal(env.clock.Now()), "the policy is asked with the server's clock")
}

func TestTablesWithoutPolicy(t *testing.T) {
	env := newTestEnv(t)
	env.reader.tables = []buckets.TableInfo{{Day: mustDay(t, "2026-11-22"), Readings: 0}}
	body := env.get(t, "/v1/tables").json(t)
	tbl := body["tables"].([]any)[0].(map[string]any)
	assert.NotContains(t, tbl, "expiresAt", "no policy, no expiry")
	assert.Contains(t, tbl, "readings", "0 is a known count")
}

func TestDropTable(t *testing.T) {
	env := newTestEnv(t)
	env.admin.tables[mustDay(t, "2026-10-01")] = buckets.TableDrop{Day: mustDay(t, "2026-10-01"), SizeBytes: 4096, Readings: 10, Reason: "manual"}

	res := env.do(t, http.MethodDelete, "/v1/tables/2026-10-01")
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	assert.JSONEq(t, `{"dropped":[{"day":"2026-10-01","sizeBytes":4096,"readings":10,"reason":"manual"}]}`, string(res.body))
	assert.Equal(t, []buckets.Day{mustDay(t, "2026-10-01")}, env.admin.dropped)

	msg := requireError(t, env.do(t, http.MethodDelete, "/v1/tables/2026-10-01"), http.StatusNotFound, "not_found", "day")
	assert.Contains(t, msg, "2026-10-01")

	for _, bad := range []string{"yesterday", "2026-13-01", "2026-1-1", "0000-01-01", "2026-10-01T00:00:00Z"} {
		t.Run(bad, func(t *testing.T) {
			requireError(t, env.do(t, http.MethodDelete, "/v1/tables/"+bad), http.StatusBadRequest, "invalid_argument", "day")
		})
	}
	assert.Len(t, env.admin.dropped, 1)
}

func TestRetentionRun(t *testing.T) {
	env := newTestEnv(t)
	env.admin.report = buckets.RetentionReport{
		Started:  time.Date(2026, 11, 22, 12, 0, 0, 123, time.UTC),
		Cutoff:   time.Date(2026, 10, 23, 12, 0, 0, 0, time.UTC),
		Dropped:  []buckets.TableDrop{{Day: mustDay(t, "2026-10-21"), SizeBytes: 10, Readings: -1, Reason: "expired"}},
		Kept:     30,
		BytesNow: 123456789,
	}
	res := env.do(t, http.MethodPost, "/v1/retention/run?dry_run=true")
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	assert.JSONEq(t, `{"dryRun":true,"startedAt":"2026-11-22T12:00:00.000000123Z","cutoff":"2026-10-23T12:00:00Z",
		"dropped":[{"day":"2026-10-21","sizeBytes":10,"reason":"expired"}],"kept":30,"bytesNow":123456789}`, string(res.body))

	env.admin.report.Dropped = nil
	res = env.do(t, http.MethodPost, "/v1/retention/run")
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	assert.Contains(t, string(res.body), `"dropped":[]`, "an empty list, not null")
	assert.Contains(t, string(res.body), `"dryRun":false`)

	requireError(t, env.do(t, http.MethodPost, "/v1/retention/run?dry_run=maybe"), http.StatusBadRequest, "invalid_argument", "dry_run")
	assert.Equal(t, []bool{true, false}, env.admin.runs)
}

func TestAdminNilIsNotImplemented(t *testing.T) {
	env := newTestEnv(t, func(c *api.Config) { c.Admin = nil })
	requireError(t, env.do(t, http.MethodDelete, "/v1/tables/2026-10-01"), http.StatusNotImplemented, "not_implemented", "server")
	requireError(t, env.do(t, http.MethodPost, "/v1/retention/run"), http.StatusNotImplemented, "not_implemented", "server")
}

func TestAdminWithoutTokenOnlyLoopback(t *testing.T) {
	env := newTestEnv(t)
	tests := []struct {
		remote string
		status int
	}{
		{"203.0.113.5:40000", http.StatusForbidden},
		{"[2001:db8::1]:40000", http.StatusForbidden},
		{"127.0.0.1:40000", http.StatusOK},
		{"[::1]:40000", http.StatusOK},
		{"[::ffff:127.0.0.1]:40000", http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.remote, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/v1/retention/run?dry_run=true", nil)
			req.RemoteAddr = tt.remote
			req.Header.Set("X-Forwarded-For", "127.0.0.1") // must not be trusted
			req.Header.Set("X-Real-IP", "127.0.0.1")
			rec := httptest.NewRecorder()
			env.srv.Handler().ServeHTTP(rec, req)
			res := response{rec.Code, rec.Header(), rec.Body.Bytes()}
			if tt.status == http.StatusForbidden {
				requireError(t, res, http.StatusForbidden, "permission_denied", "authorization")
				return
			}
			assert.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
		})
	}
	assert.Len(t, env.admin.runs, 3)
}
