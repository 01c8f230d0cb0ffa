package api_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
)

// DELETE /v1/devices/{device} needs scope admin, the device inside the
// token's patterns, a valid device ID and a known device, and answers
// what was removed.
func TestDeleteDeviceEndpoint(t *testing.T) {
	const adminSim = "admin-sim-secret-0123456789"
	env := newTestEnv(t, func(c *api.Config) {
		f := authFile()
		f.Tokens = append(f.Tokens, auth.Token{Name: "admin-sim", Secret: auth.HashSecret(adminSim),
			Scopes: []auth.Scope{auth.ScopeAdmin}, Devices: []string{"sim-*"}})
		c.Auth = auth.Static(f)
	})
	env.reader.add(reading(t, "dev-1", mustTicks(t, "2026-11-22T10:00:00Z"), 1))
	deleted := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	env.admin.devices = map[buckets.DeviceID]buckets.DeviceDelete{
		"dev-1": {Device: "dev-1", Deleted: deleted, Readings: 42, Tables: 3},
		"sim-1": {Device: "sim-1", Deleted: deleted, Readings: -1},
	}

	requireError(t, env.do(t, http.MethodDelete, "/v1/devices/dev-1"), http.StatusUnauthorized, "unauthenticated", "authorization")
	msg := requireError(t, env.do(t, http.MethodDelete, "/v1/devices/dev-1", bearer(readAll)...),
		http.StatusForbidden, "permission_denied", "authorization")
	assert.Contains(t, msg, "admin", "names the scope it lacks")
	requireError(t, env.do(t, http.MethodDelete, "/v1/devices/dev-1", bearer(writeOnly)...),
		http.StatusForbidden, "permission_denied", "authorization")
	msg = requireError(t, env.do(t, http.MethodDelete, "/v1/devices/-bad", bearer(adminOnly)...),
		http.StatusBadRequest, "invalid_argument", "device")
	assert.Contains(t, msg, "must start with a letter or digit")
	msg = requireError(t, env.do(t, http.MethodDelete, "/v1/devices/nosuch", bearer(adminOnly)...),
		http.StatusNotFound, "not_found", "device")
	assert.Contains(t, msg, `"nosuch" is not known`)
	requireError(t, env.do(t, http.MethodDelete, "/v1/devices/dev-1", bearer(adminSim)...),
		http.StatusNotFound, "not_found", "device") // outside the token's patterns: as if unknown
	assert.Empty(t, env.admin.deleted, "nothing deleted by the refused requests")

	r := env.do(t, http.MethodDelete, "/v1/devices/dev-1", bearer(adminOnly)...)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var got api.DeviceDeleteResult
	require.NoError(t, json.Unmarshal(r.body, &got))
	require.NotNil(t, got.Readings)
	assert.Equal(t, api.DeviceDeleteResult{Device: "dev-1", Deleted: deleted, Readings: got.Readings, Tables: 3}, got)
	assert.Equal(t, int64(42), *got.Readings)
	assert.Equal(t, []buckets.DeviceID{"dev-1"}, env.admin.deleted)
	assert.Contains(t, env.logs.String(), "device deleted by admin request")

	r = env.do(t, http.MethodDelete, "/v1/devices/sim-1", bearer(adminSim)...)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	assert.NotContains(t, string(r.body), "readings", "an unknown count is left out")

	requireError(t, env.do(t, http.MethodDelete, "/v1/devices/dev-1", bearer(adminOnly)...),
		http.StatusNotFound, "not_found", "device")
	assert.Equal(t, http.StatusOK, env.do(t, http.MethodGet, "/v1/devices/dev-1/readings/latest", bearer(readAll)...).status,
		"GET of the same path stays scope read")
}
