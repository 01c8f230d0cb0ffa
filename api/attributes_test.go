package api_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
)

// send sends a request with a body to the test server.
func (e *testEnv) send(t *testing.T, method, path, body string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{res.StatusCode, res.Header, b}
}

// attributesOf decodes the attributes object of an answer.
func attributesOf(t *testing.T, r response) map[string]any {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	a, ok := r.json(t)["attributes"].(map[string]any)
	require.True(t, ok, "attributes is an object: %s", r.body)
	return a
}

func TestDeviceRecord(t *testing.T) {
	env := newTestEnv(t)
	env.reader.devices = []buckets.DeviceInfo{{Device: "truck_1", FirstSeen: mustTicks(t, "2026-11-20T00:00:00Z"),
		LastSeen: mustTicks(t, contractTS), Latest: []buckets.Field{{Name: "fuel", Value: buckets.Float(0.5)}}}}
	env.reader.setAttributes("truck_1", "fleet", "East")

	res := env.get(t, "/v1/devices/truck_1")
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	assert.JSONEq(t, `{"device":"truck_1","attributes":{"fleet":"East"},"firstSeen":"2026-11-20T00:00:00Z",
		"lastSeen":"`+contractTS+`","latest":{"fuel":0.5}}`, string(res.body))

	requireError(t, env.get(t, "/v1/devices/truck_9"), http.StatusNotFound, "not_found", "device")
	requireError(t, env.get(t, "/v1/devices/a.b"), http.StatusBadRequest, "invalid_argument", "device")

	t.Run("without attributes configured", func(t *testing.T) {
		env := newTestEnv(t, func(c *api.Config) { c.Attributes = nil })
		requireError(t, env.get(t, "/v1/devices/truck_1"), http.StatusNotImplemented, "not_implemented", "path")
		requireError(t, env.send(t, http.MethodPut, "/v1/devices/truck_1/attributes", `{}`), http.StatusNotImplemented, "not_implemented", "path")
	})
}

func TestAttributeWrites(t *testing.T) {
	env := newTestEnv(t)
	put := func(body string) response { return env.send(t, http.MethodPut, "/v1/devices/truck_1/attributes", body) }
	patch := func(body string) response {
		return env.send(t, http.MethodPatch, "/v1/devices/truck_1/attributes", body)
	}

	// A device not known yet gets a record.
	assert.Equal(t, map[string]any{"fleet": "East", "model": "F-150"}, attributesOf(t, put(`{"fleet":"East","model":"F-150"}`)))
	assert.Equal(t, map[string]any{"fleet": "East", "model": "F-150"}, attributesOf(t, env.get(t, "/v1/devices/truck_1")))

	// PATCH merges; null removes.
	env.clock.Add(time.Second)
	assert.Equal(t, map[string]any{"fleet": "West", "depot": "Leeds"},
		attributesOf(t, patch(`{"fleet":"West","model":null,"depot":"Leeds"}`)))
	// PUT replaces the whole set.
	env.clock.Add(time.Second)
	assert.Equal(t, map[string]any{"region": "north"}, attributesOf(t, put(`{"region":"north"}`)))
	// An empty PUT clears it; an empty PATCH changes nothing.
	env.clock.Add(time.Second)
	assert.Equal(t, map[string]any{}, attributesOf(t, put(`{}`)))
	assert.Equal(t, map[string]any{}, attributesOf(t, patch(` {} `)))

	// Every change is stamped with the request's arrival.
	env.reader.mu.Lock()
	as := env.reader.assigns
	env.reader.mu.Unlock()
	require.Len(t, as, 5)
	for i, a := range as {
		assert.Equal(t, buckets.DeviceID("truck_1"), a.Device)
		assert.Equal(t, buckets.MustTicks(testNow.Add(time.Duration(min(i, 3))*time.Second)), a.At, "assignment %d", i)
	}
	assert.True(t, as[0].Replace)
	assert.False(t, as[1].Replace)
	assert.Equal(t, []string{"model"}, as[1].Remove)
	assert.Equal(t, buckets.Attributes{{Name: "depot", Value: "Leeds"}, {Name: "fleet", Value: "West"}}, as[1].Set, "sorted by name")
}

func TestAttributeWriteLimits(t *testing.T) {
	attrs := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf(`"a%02d":"v"`, i)
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	tests := []struct {
		name, method, body string
		status             int
		code, field        string
	}{
		{"64 attributes", http.MethodPut, attrs(64), 200, "", ""},
		{"65 attributes", http.MethodPut, attrs(65), 400, "too_many_attributes", "attributes"},
		{"65 attributes in a patch", http.MethodPatch, attrs(65), 400, "too_many_attributes", "attributes"},
		{"value of 256 bytes", http.MethodPut, `{"fleet":"` + strings.Repeat("x", 256) + `"}`, 200, "", ""},
		{"value of 257 bytes", http.MethodPut, `{"fleet":"` + strings.Repeat("x", 257) + `"}`, 400, "invalid_attribute_value", "attributes.fleet"},
		{"value of 256 bytes in 2-byte runes", http.MethodPut, `{"fleet":"` + strings.Repeat("é", 128) + `"}`, 200, "", ""},
		{"empty value", http.MethodPut, `{"fleet":""}`, 400, "invalid_attribute_value", "attributes.fleet"},
		{"number", http.MethodPut, `{"fleet":7}`, 400, "invalid_attribute_value", "attributes.fleet"},
		{"object", http.MethodPatch, `{"fleet":{"a":"b"}}`, 400, "invalid_attribute_value", "attributes.fleet"},
		{"null in a put", http.MethodPut, `{"fleet":null}`, 400, "invalid_attribute_value", "attributes.fleet"},
		{"null in a patch", http.MethodPatch, `{"fleet":null}`, 200, "", ""},
		{"name of 64 bytes", http.MethodPut, `{"` + strings.Repeat("n", 64) + `":"v"}`, 200, "", ""},
		{"name of 65 bytes", http.MethodPut, `{"` + strings.Repeat("n", 65) + `":"v"}`, 400, "invalid_attribute_name", "attributes." + strings.Repeat("n", 65)},
		{"name device", http.MethodPatch, `{"device":"x"}`, 400, "invalid_attribute_name", "attributes.device"},
		{"reserved name", http.MethodPut, `{"__name__":"x"}`, 400, "invalid_attribute_name", "attributes.__name__"},
		{"name with a dash", http.MethodPut, `{"fleet-id":"x"}`, 400, "invalid_attribute_name", "attributes.fleet-id"},
		{"first bad name in order", http.MethodPut, `{"z-z":"x","a-a":"y"}`, 400, "invalid_attribute_name", "attributes.a-a"},
		{"not an object", http.MethodPut, `["fleet"]`, 400, "invalid_argument", "body"},
		{"not JSON", http.MethodPatch, `fleet=East`, 400, "invalid_argument", "body"},
		{"no body", http.MethodPut, ``, 400, "invalid_argument", "body"},
		{"bad device", http.MethodPut, `{}`, 400, "invalid_argument", "device"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t)
			path := "/v1/devices/truck_1/attributes"
			if tt.name == "bad device" {
				path = "/v1/devices/a.b/attributes"
			}
			res := env.send(t, tt.method, path, tt.body)
			if tt.status == http.StatusOK {
				require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
				return
			}
			requireError(t, res, tt.status, tt.code, tt.field)
		})
	}

	t.Run("too many after a patch", func(t *testing.T) {
		env := newTestEnv(t)
		require.Equal(t, http.StatusOK, env.send(t, http.MethodPut, "/v1/devices/truck_1/attributes", attrs(64)).status)
		// One more is 65 once merged: the store refuses it, with the code.
		requireError(t, env.send(t, http.MethodPatch, "/v1/devices/truck_1/attributes", `{"zz":"v"}`),
			http.StatusBadRequest, "too_many_attributes", "attributes")
		// Replacing one keeps 64.
		env.clock.Add(time.Second)
		assert.Len(t, attributesOf(t, env.send(t, http.MethodPatch, "/v1/devices/truck_1/attributes", `{"a00":null,"zz":"v"}`)), 64)
	})

	t.Run("body size", func(t *testing.T) {
		env := newTestEnv(t)
		// The largest valid set, every value byte escaped, fits.
		var parts []string
		for i := range 64 {
			name := fmt.Sprintf("%s%02d", strings.Repeat("n", 62), i)
			parts = append(parts, `"`+name+`":"`+strings.Repeat(`\u0041`, 256)+`"`)
		}
		largest := "{" + strings.Join(parts, ",") + "}"
		require.Less(t, len(largest), api.MaxAttributesBodyBytes)
		assert.Len(t, attributesOf(t, env.send(t, http.MethodPut, "/v1/devices/truck_1/attributes", largest)), 64)

		at := func(n int) string { return `{"fleet":"East"` + strings.Repeat(" ", n-len(`{"fleet":"East"}`)) + `}` }
		assert.Equal(t, map[string]any{"fleet": "East"}, attributesOf(t, env.send(t, http.MethodPatch, "/v1/devices/truck_2/attributes", at(api.MaxAttributesBodyBytes))))
		requireError(t, env.send(t, http.MethodPatch, "/v1/devices/truck_2/attributes", at(api.MaxAttributesBodyBytes+1)),
			http.StatusRequestEntityTooLarge, "payload_too_large", "body")
	})
}

// Token secrets of the attribute tests.
const (
	truck1Writer = "truck1-writer-secret-0123456789"
	truck1Reader = "truck1-reader-secret-0123456789"
	allWriter    = "all-writer-secret-0123456789"
)

func newAttributeAuthEnv(t *testing.T) *testEnv {
	t.Helper()
	f := &auth.File{Tokens: []auth.Token{
		{Name: "truck1-writer", Secret: auth.HashSecret(truck1Writer), Scopes: []auth.Scope{auth.ScopeRead, auth.ScopeWrite}, Devices: []string{"truck_1*"}},
		{Name: "truck1-reader", Secret: auth.HashSecret(truck1Reader), Scopes: []auth.Scope{auth.ScopeRead}, Devices: []string{"truck_1*"}},
		{Name: "all-writer", Secret: auth.HashSecret(allWriter), Scopes: []auth.Scope{auth.ScopeRead, auth.ScopeWrite}},
	}}
	env := newTestEnv(t, func(c *api.Config) { c.Auth = auth.Static(f) })
	env.reader.devices = []buckets.DeviceInfo{{Device: "truck_1"}, {Device: "truck_10"}, {Device: "truck_2"}}
	env.reader.setAttributes("truck_1", "fleet", "East")
	env.reader.setAttributes("truck_10", "fleet", "East")
	env.reader.setAttributes("truck_2", "fleet", "West", "secret_route", "A1")
	return env
}

func TestAttributesScopesAndPatterns(t *testing.T) {
	env := newAttributeAuthEnv(t)
	path := "/v1/devices/%s/attributes"

	t.Run("read", func(t *testing.T) {
		res := env.do(t, http.MethodGet, "/v1/devices/truck_1", bearer(truck1Reader)...)
		assert.Equal(t, map[string]any{"fleet": "East"}, attributesOf(t, res))
		// Another device is not known to the token, like one that does not exist.
		requireError(t, env.do(t, http.MethodGet, "/v1/devices/truck_2", bearer(truck1Reader)...), http.StatusNotFound, "not_found", "device")
		requireError(t, env.do(t, http.MethodGet, "/v1/devices/truck_2"), http.StatusUnauthorized, "unauthenticated", "authorization")
	})
	t.Run("write needs scope write", func(t *testing.T) {
		requireError(t, env.send(t, http.MethodPut, fmt.Sprintf(path, "truck_1"), `{"fleet":"North"}`, bearer(truck1Reader)...),
			http.StatusForbidden, "permission_denied", "authorization")
		requireError(t, env.send(t, http.MethodPatch, fmt.Sprintf(path, "truck_1"), `{"fleet":"North"}`, bearer(truck1Reader)...),
			http.StatusForbidden, "permission_denied", "authorization")
	})
	t.Run("write within the patterns", func(t *testing.T) {
		res := env.send(t, http.MethodPatch, fmt.Sprintf(path, "truck_1"), `{"fleet":"North"}`, bearer(truck1Writer)...)
		assert.Equal(t, map[string]any{"fleet": "North"}, attributesOf(t, res))
	})
	t.Run("write outside the patterns", func(t *testing.T) {
		for _, m := range []string{http.MethodPut, http.MethodPatch} {
			requireError(t, env.send(t, m, fmt.Sprintf(path, "truck_2"), `{"fleet":"North"}`, bearer(truck1Writer)...),
				http.StatusNotFound, "not_found", "device")
		}
		// truck_2 is untouched.
		res := env.do(t, http.MethodGet, "/v1/devices/truck_2", bearer(allWriter)...)
		assert.Equal(t, map[string]any{"fleet": "West", "secret_route": "A1"}, attributesOf(t, res))
	})
	t.Run("listing", func(t *testing.T) {
		body := env.do(t, http.MethodGet, "/v1/devices"+q("match", `{fleet=~".+"}`), bearer(truck1Reader)...).json(t)
		var got []string
		for _, d := range body["devices"].([]any) {
			got = append(got, d.(map[string]any)["device"].(string))
		}
		assert.Equal(t, []string{"truck_1", "truck_10"}, got)
		// The store is told which devices the token sees, and filters.
		env.reader.mu.Lock()
		last := env.reader.devQs[len(env.reader.devQs)-1]
		env.reader.mu.Unlock()
		require.NotNil(t, last.Visible)
		assert.True(t, last.Visible("truck_10"))
		assert.False(t, last.Visible("truck_2"))
	})
}

func TestDevicesMatch(t *testing.T) {
	env := newTestEnv(t)
	for _, d := range []string{"truck_1", "truck_2", "truck_3", "van_1"} {
		env.reader.devices = append(env.reader.devices, buckets.DeviceInfo{Device: buckets.DeviceID(d)})
	}
	env.reader.setAttributes("truck_1", "fleet", "East", "model", "F-150")
	env.reader.setAttributes("truck_2", "fleet", "East", "model", "R-1")
	env.reader.setAttributes("truck_3", "fleet", "West", "model", "F-250")
	env.reader.setAttributes("van_1", "fleet", "East")
	list := func(query string) []string {
		t.Helper()
		res := env.get(t, "/v1/devices"+query)
		require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
		var out []string
		for _, d := range res.json(t)["devices"].([]any) {
			out = append(out, d.(map[string]any)["device"].(string))
		}
		return out
	}
	assert.Equal(t, []string{"truck_1"}, list(q("match", `{fleet="East",model=~"F-.*"}`)))
	assert.Equal(t, []string{"truck_2", "van_1"}, list(q("match", `{fleet="East",model!~"F-.*"}`)), "a missing attribute matches as empty")
	assert.Equal(t, []string{"truck_3"}, list(q("match", `{fleet!="East"}`)))
	assert.Equal(t, []string{"van_1"}, list(q("match", `{model=""}`)))
	assert.Equal(t, []string{"truck_1", "truck_2"}, list(q("match", `{fleet="East",device=~"truck.*"}`)))
	assert.Equal(t, []string{"truck_1", "truck_2"}, list(q("match", `{fleet="East"}`, "prefix", "truck")))

	t.Run("paging keeps the filter", func(t *testing.T) {
		res := env.get(t, "/v1/devices"+q("match", `{fleet="East"}`, "limit", "2"))
		body := res.json(t)
		next := body["next"].(string)
		assert.Equal(t, []string{"van_1"}, list(q("cursor", next, "limit", "2")))
		assert.Equal(t, []string{"van_1"}, list(q("cursor", next, "match", `{fleet="East"}`)))
		requireError(t, env.get(t, "/v1/devices"+q("cursor", next, "match", `{fleet="West"}`)), http.StatusBadRequest, "invalid_argument", "cursor")
	})
	t.Run("bad matchers", func(t *testing.T) {
		for _, m := range []string{`{fleet="East"`, `{fleet=~"("}`, `fleet`, `{__name__="x"}`, `temp{fleet="East"}`,
			`{__fleet="x"}`, `{"fleet.id"="x"}`, `{fleet=East}`, strings.Repeat(" ", 4097)} {
			msg := requireError(t, env.get(t, "/v1/devices"+q("match", m)), http.StatusBadRequest, "invalid_argument", "match")
			assert.NotEmpty(t, msg)
		}
		msg := requireError(t, env.get(t, "/v1/devices"+q("match", `{__name__="x"}`)), http.StatusBadRequest, "invalid_argument", "match")
		assert.Contains(t, msg, `__name__="x"`, "the message names the matcher")
	})
}

func TestDevicesSilentFor(t *testing.T) {
	env := newTestEnv(t, func(c *api.Config) { c.Retention = 30 * 24 * time.Hour })
	at := func(ago time.Duration) buckets.Ticks { return buckets.MustTicks(testNow.Add(-ago)) }
	env.reader.devices = []buckets.DeviceInfo{
		{Device: "a_live", LastSeen: at(time.Minute)},
		{Device: "b_edge", LastSeen: at(10 * time.Minute)},   // exactly silent_for ago: not older
		{Device: "c_silent", LastSeen: at(11 * time.Minute)}, // silent
		{Device: "d_gone", LastSeen: at(31 * 24 * time.Hour)},
		{Device: "e_never"}, // known by its attributes only
		{Device: "f_silent", LastSeen: at(29 * 24 * time.Hour)},
	}
	env.reader.setAttributes("c_silent", "fleet", "East")
	env.reader.setAttributes("f_silent", "fleet", "West")
	list := func(query string) (out []string, next string) {
		t.Helper()
		res := env.get(t, "/v1/devices"+query)
		require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
		body := res.json(t)
		for _, d := range body["devices"].([]any) {
			out = append(out, d.(map[string]any)["device"].(string))
		}
		next, _ = body["next"].(string)
		return out, next
	}
	got, _ := list(q("silent_for", "10m"))
	assert.Equal(t, []string{"c_silent", "f_silent"}, got)
	got, _ = list(q("silent_for", "10m", "match", `{fleet="East"}`))
	assert.Equal(t, []string{"c_silent"}, got)

	env.reader.mu.Lock()
	last := env.reader.devQs[len(env.reader.devQs)-1]
	env.reader.mu.Unlock()
	assert.Equal(t, buckets.MustTicks(testNow.Add(-10*time.Minute)), last.SilentBefore, "SilentBefore = now - silent_for")

	t.Run("paging keeps the times of the first page", func(t *testing.T) {
		got, next := list(q("silent_for", "10m", "limit", "1"))
		assert.Equal(t, []string{"c_silent"}, got)
		require.NotEmpty(t, next)
		env.clock.Add(time.Hour) // a_live and b_edge are silent now, but this listing began earlier
		got, next = list(q("cursor", next, "limit", "1"))
		assert.Equal(t, []string{"f_silent"}, got)
		assert.Empty(t, next)
		requireError(t, env.get(t, "/v1/devices"+q("cursor", next+"x", "silent_for", "10m")), http.StatusBadRequest, "invalid_argument", "cursor")
	})
	t.Run("bounds", func(t *testing.T) {
		for _, s := range []string{"abc", "0s", "999ms", "-5m", "30d", "31d"} {
			requireError(t, env.get(t, "/v1/devices"+q("silent_for", s)), http.StatusBadRequest, "invalid_argument", "silent_for")
		}
		_, _ = list(q("silent_for", "1s"))
		_, _ = list(q("silent_for", "29d"))
		got, _ := list(q("silent_for", "719h59m59s"))
		assert.Empty(t, got, "just under the retention: nothing that old is both silent and kept")
	})
}
