package main

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// authJSON sends a request with a JSON body and a bearer token.
func authJSON(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAttributesFollowTheTokensPatterns: through the service and its
// store, a token limited to truck_1* can neither read nor set truck_2's
// attributes, and learns none of them from device lists, label names
// or label values.
func TestAttributesFollowTheTokensPatterns(t *testing.T) {
	inLane(t, lanes.general)
	f := newAuthFixture(t, nil, "ops:read,write", "t1:read,write:truck_1*", "t1read:read:truck_1*")
	cfg := newTestConfig(t)
	cfg.Security.AuthFile = f.path
	m := openTestService(t, cfg)
	base := "http://" + m.HTTPAddr()
	ops, t1, t1read := f.tokens["ops"], f.tokens["t1"], f.tokens["t1read"]
	put := func(token, dev, body string) (int, string) {
		return authJSON(t, http.MethodPut, base+"/v1/devices/"+dev+"/attributes", token, body)
	}

	code, body := put(ops, "truck_1", `{"fleet":"East"}`)
	require.Equal(t, http.StatusOK, code, body)
	code, body = put(ops, "truck_2", `{"fleet":"West","route":"secret"}`)
	require.Equal(t, http.StatusOK, code, body)

	for _, method := range []string{http.MethodPut, http.MethodPatch} {
		code, body = authJSON(t, method, base+"/v1/devices/truck_2/attributes", t1, `{"fleet":"East"}`)
		assert.Equal(t, http.StatusNotFound, code, "%s of a device outside the patterns: %s", method, body)
	}
	code, _ = httpDo(t, nil, http.MethodGet, base+"/v1/devices/truck_2", t1)
	assert.Equal(t, http.StatusNotFound, code)
	code, body = authJSON(t, http.MethodPatch, base+"/v1/devices/truck_10/attributes", t1read, `{"fleet":"North"}`)
	assert.Equal(t, http.StatusForbidden, code, "scope read cannot set: %s", body)
	code, body = authJSON(t, http.MethodPatch, base+"/v1/devices/truck_10/attributes", t1, `{"fleet":"North"}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.JSONEq(t, `{"device":"truck_10","attributes":{"fleet":"North"}}`, body)

	code, body = httpDo(t, nil, http.MethodGet, base+"/v1/devices/truck_2", ops)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"attributes":{"fleet":"West","route":"secret"}`, "truck_2 untouched")

	for _, tc := range []struct{ token, path, want string }{
		{t1read, "/api/v1/label/fleet/values", `["East","North"]`},
		{ops, "/api/v1/label/fleet/values", `["East","North","West"]`},
		{t1read, "/api/v1/label/route/values", `[]`},
		{t1read, "/api/v1/labels", `["__name__","device","fleet"]`},
		{ops, "/api/v1/labels", `["__name__","device","fleet","route"]`},
	} {
		code, body = httpDo(t, nil, http.MethodGet, base+tc.path, tc.token)
		require.Equal(t, http.StatusOK, code, body)
		assert.JSONEq(t, `{"status":"success","data":`+tc.want+`}`, body, tc.path)
	}
	code, body = httpDo(t, nil, http.MethodGet, base+"/v1/devices?match="+url.QueryEscape(`{fleet=~".+"}`), t1read)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"device":"truck_1"`)
	assert.Contains(t, body, `"device":"truck_10"`)
	assert.NotContains(t, body, "truck_2")
	assert.NotContains(t, body, "West")
}
