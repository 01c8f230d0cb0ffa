package api_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
)

// Token secrets of the auth tests.
const (
	readAll   = "read-all-secret-0123456789"
	readSim   = "read-sim-secret-0123456789"
	adminOnly = "admin-only-secret-0123456789"
	metricsTk = "metrics-secret-0123456789"
	writeOnly = "write-only-secret-0123456789"
)

func authFile() *auth.File {
	tok := func(name, secret string, devices []string, scopes ...auth.Scope) auth.Token {
		return auth.Token{Name: name, Secret: auth.HashSecret(secret), Scopes: scopes, Devices: devices}
	}
	return &auth.File{Tokens: []auth.Token{
		tok("all", readAll, nil, auth.ScopeRead),
		tok("sim", readSim, []string{"sim-*"}, auth.ScopeRead),
		tok("admin", adminOnly, nil, auth.ScopeAdmin),
		tok("metrics", metricsTk, nil, auth.ScopeMetrics),
		tok("writer", writeOnly, nil, auth.ScopeWrite),
	}}
}

func withAuth(c *api.Config) {
	c.Auth = auth.Static(authFile())
	c.Metrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("up 1\n")) })
}

func bearer(secret string) []string { return []string{"Authorization", "Bearer " + secret} }

func newAuthEnv(t *testing.T) *testEnv {
	env := newTestEnv(t, withAuth)
	for _, dev := range []string{"dev-1", "sim-1", "sim-2"} {
		env.reader.add(reading(t, dev, mustTicks(t, "2026-11-22T10:00:00Z"), 1))
	}
	env.reader.devices = []buckets.DeviceInfo{{Device: "dev-1"}, {Device: "dev-2"}, {Device: "sim-1"}, {Device: "sim-2"}, {Device: "zzz"}}
	return env
}

func TestAuthNoTokenIs401(t *testing.T) {
	env := newAuthEnv(t)
	for _, path := range []string{"/v1/devices", "/v1/devices/dev-1/readings/latest", "/v1/tables", "/v1/nowhere", "/metrics"} {
		t.Run(path, func(t *testing.T) {
			r := env.get(t, path)
			requireError(t, r, http.StatusUnauthorized, "unauthenticated", "authorization")
			assert.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer")
		})
	}
	t.Run("wrong token", func(t *testing.T) {
		msg := requireError(t, env.do(t, http.MethodGet, "/v1/devices", bearer("not-a-token-0123456789")...),
			http.StatusUnauthorized, "unauthenticated", "authorization")
		assert.Contains(t, msg, "not valid")
	})
	t.Run("Token scheme only on write endpoints", func(t *testing.T) {
		requireError(t, env.do(t, http.MethodGet, "/v1/devices", "Authorization", "Token "+readAll),
			http.StatusUnauthorized, "unauthenticated", "authorization")
	})
}

func TestAuthOpenEndpoints(t *testing.T) {
	env := newAuthEnv(t)
	for _, path := range []string{"/healthz", "/readyz", "/openapi.json"} {
		assert.Equal(t, http.StatusOK, env.get(t, path).status, path)
	}
}

func TestAuthScopes(t *testing.T) {
	env := newAuthEnv(t)
	day, err := buckets.ParseDay("2026-11-20")
	require.NoError(t, err)
	env.admin.tables[day] = buckets.TableDrop{Day: day}
	tests := []struct {
		name, method, path, secret string
		want                       int
	}{
		{"read reads", http.MethodGet, "/v1/devices/dev-1/readings/latest", readAll, http.StatusOK},
		{"read lists tables", http.MethodGet, "/v1/tables", readAll, http.StatusOK},
		{"admin cannot read", http.MethodGet, "/v1/devices/dev-1/readings/latest", adminOnly, http.StatusForbidden},
		{"write cannot read", http.MethodGet, "/v1/devices", writeOnly, http.StatusForbidden},
		{"read cannot drop", http.MethodDelete, "/v1/tables/2026-11-20", readAll, http.StatusForbidden},
		{"read cannot run retention", http.MethodPost, "/v1/retention/run?dry_run=true", readAll, http.StatusForbidden},
		{"admin runs retention", http.MethodPost, "/v1/retention/run?dry_run=true", adminOnly, http.StatusOK},
		{"read cannot scrape", http.MethodGet, "/metrics", readAll, http.StatusForbidden},
		{"metrics scrapes", http.MethodGet, "/metrics", metricsTk, http.StatusOK},
		{"metrics cannot read", http.MethodGet, "/v1/devices", metricsTk, http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := env.do(t, tt.method, tt.path, bearer(tt.secret)...)
			if tt.want == http.StatusForbidden {
				requireError(t, r, tt.want, "permission_denied", "authorization")
				return
			}
			assert.Equal(t, tt.want, r.status, "body: %s", r.body)
		})
	}
	t.Run("admin from loopback without a token", func(t *testing.T) {
		requireError(t, env.do(t, http.MethodDelete, "/v1/tables/2026-11-20"), http.StatusUnauthorized, "unauthenticated", "authorization")
		assert.Empty(t, env.admin.dropped, "nothing dropped")
	})
	t.Run("admin drops", func(t *testing.T) {
		r := env.do(t, http.MethodDelete, "/v1/tables/2026-11-20", bearer(adminOnly)...)
		assert.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	})
}

func TestAuthDevicePatternsHideDevices(t *testing.T) {
	env := newAuthEnv(t)
	for _, path := range []string{"/v1/devices/dev-1/readings/latest", "/v1/devices/dev-1/readings",
		"/v1/devices/dev-1/readings/2026-11-22T10:00:00Z"} {
		t.Run(path, func(t *testing.T) {
			requireError(t, env.do(t, http.MethodGet, path, bearer(readSim)...), http.StatusNotFound, "not_found", "device")
			assert.Equal(t, http.StatusOK, env.do(t, http.MethodGet, path, bearer(readAll)...).status, "visible to the unrestricted token")
		})
	}
	t.Run("own device", func(t *testing.T) {
		r := env.do(t, http.MethodGet, "/v1/devices/sim-1/readings/latest", bearer(readSim)...)
		assert.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	})
	listed := func(t *testing.T, secret, query string) (ids []string, next string) {
		r := env.do(t, http.MethodGet, "/v1/devices"+query, bearer(secret)...)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		body := r.json(t)
		for _, d := range body["devices"].([]any) {
			ids = append(ids, d.(map[string]any)["device"].(string))
		}
		if n, ok := body["next"]; ok {
			next = n.(string)
		}
		return ids, next
	}
	t.Run("devices list", func(t *testing.T) {
		ids, _ := listed(t, readSim, "")
		assert.Equal(t, []string{"sim-1", "sim-2"}, ids)
		ids, _ = listed(t, readAll, "")
		assert.Len(t, ids, 5)
	})
	t.Run("devices list pages skip hidden devices", func(t *testing.T) {
		ids, next := listed(t, readSim, "?limit=1")
		require.Equal(t, []string{"sim-1"}, ids)
		require.NotEmpty(t, next)
		ids, next = listed(t, readSim, "?limit=1&cursor="+next)
		assert.Equal(t, []string{"sim-2"}, ids)
		if next != "" {
			ids, next = listed(t, readSim, "?limit=1&cursor="+next)
			assert.Empty(t, ids, "zzz stays hidden")
			assert.Empty(t, next)
		}
	})
}

func TestRateLimit(t *testing.T) {
	env := newTestEnv(t, withAuth, func(c *api.Config) { c.RateLimit, c.RateBurst = 1, 2 })
	for i := range 2 {
		require.Equal(t, http.StatusOK, env.do(t, http.MethodGet, "/v1/tables", bearer(readAll)...).status, "request %d within the burst", i)
	}
	r := env.do(t, http.MethodGet, "/v1/tables", bearer(readAll)...)
	requireError(t, r, http.StatusTooManyRequests, "resource_exhausted", "request")
	wait, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", r.header.Get("Retry-After"))
	assert.GreaterOrEqual(t, wait, 1)
	assert.Equal(t, http.StatusOK, env.do(t, http.MethodGet, "/v1/tables", bearer(readSim)...).status, "another token has its own bucket")
	assert.Equal(t, http.StatusOK, env.get(t, "/healthz").status, "probes are not limited")
	t.Run("unauthenticated clients are limited by address", func(t *testing.T) {
		env := newTestEnv(t, withAuth, func(c *api.Config) { c.RateLimit, c.RateBurst = 1, 1 })
		requireError(t, env.get(t, "/v1/tables"), http.StatusUnauthorized, "unauthenticated", "")
		requireError(t, env.get(t, "/v1/tables"), http.StatusTooManyRequests, "resource_exhausted", "")
	})
	t.Run("without auth, by address", func(t *testing.T) {
		env := newTestEnv(t, func(c *api.Config) { c.RateLimit, c.RateBurst = 1, 1 })
		assert.Equal(t, http.StatusOK, env.get(t, "/v1/tables").status)
		requireError(t, env.get(t, "/v1/tables"), http.StatusTooManyRequests, "resource_exhausted", "")
	})
}

// openServer starts a real listening server (not httptest) for
// connection-level limits.
func openServer(t *testing.T, edit func(*api.Config)) *api.Server {
	t.Helper()
	env := newTestEnv(t, edit)
	require.NoError(t, env.srv.Open())
	t.Cleanup(func() { _ = env.srv.Close(t.Context()) })
	return env.srv
}

func TestConnectionCapPerClient(t *testing.T) {
	srv := openServer(t, func(c *api.Config) { c.MaxConnsPerClient = 2 })
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", srv.Addr())
		require.NoError(t, err)
		held = append(held, c)
	}
	var refusal []byte
	get := func() (int, error) {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			return 0, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		refusal, err = io.ReadAll(res.Body)
		return res.StatusCode, err
	}
	status, err := get()
	require.NoError(t, err, "the refusal's body is as long as its Content-Length says")
	assert.Equal(t, http.StatusServiceUnavailable, status, "a third connection is refused at once")
	var e struct {
		Error struct{ Code, Message string }
	}
	require.NoError(t, json.Unmarshal(refusal, &e), "the refusal is JSON: %q", refusal)
	assert.Equal(t, "resource_exhausted", e.Error.Code)
	held[0].Close()
	require.Eventually(t, func() bool { s, err := get(); return err == nil && s == http.StatusOK }, 5*time.Second, 20*time.Millisecond,
		"a slot freed by closing is usable")
}

// The Prometheus query API's clients read errors in the Prometheus
// shape, so what the middleware answers on /api/v1/ before the API runs
// takes that shape; other paths keep the service's own.
func TestPromPathsAnswerErrorsInPrometheusShape(t *testing.T) {
	env := newAuthEnv(t)
	type promError struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
	}
	decode := func(t *testing.T, r response) promError {
		t.Helper()
		var e promError
		require.NoError(t, json.Unmarshal(r.body, &e), "%s", r.body)
		// Go's decoder matches keys regardless of case; Grafana's
		// browser side does not, so the spelling is checked too.
		assert.ElementsMatch(t, []string{"status", "errorType", "error"}, keys(r.json(t)), "%s", r.body)
		return e
	}
	r := env.get(t, "/api/v1/query?query=up")
	require.Equal(t, http.StatusUnauthorized, r.status)
	e := decode(t, r)
	assert.Equal(t, promError{Status: "error", ErrorType: "unauthenticated", Error: e.Error}, e)
	assert.True(t, strings.HasPrefix(e.Error, "authorization: "), e.Error)
	assert.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer")

	r = env.do(t, http.MethodGet, "/api/v1/label/device/values", bearer(readAll)...)
	require.Equal(t, http.StatusNotImplemented, r.status, "no PromQL engine in this server")
	assert.Equal(t, promError{Status: "error", ErrorType: "not_implemented",
		Error: "path: the Prometheus query API is not served by this instance"}, decode(t, r))

	r = env.do(t, http.MethodGet, "/api/v1/no-such-path", bearer(readAll)...)
	require.Equal(t, http.StatusNotFound, r.status)
	assert.Equal(t, "not_found", decode(t, r).ErrorType)

	requireError(t, env.get(t, "/v1/devices"), http.StatusUnauthorized, "unauthenticated", "authorization")
}
