package api_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
)

type openAPIDoc struct {
	OpenAPI string                                `json:"openapi"`
	Paths   map[string]map[string]json.RawMessage `json:"paths"`
	Comps   struct {
		Parameters map[string]json.RawMessage `json:"parameters"`
		Schemas    map[string]json.RawMessage `json:"schemas"`
		Responses  map[string]json.RawMessage `json:"responses"`
	} `json:"components"`
}

func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	env := newTestEnv(t)
	res := env.get(t, "/openapi.json")
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, "application/json", res.header.Get("Content-Type"))
	assert.Equal(t, api.OpenAPI(), res.body)

	var doc openAPIDoc
	require.NoError(t, json.Unmarshal(res.body, &doc))
	assert.True(t, strings.HasPrefix(doc.OpenAPI, "3.0."))

	var documented []string
	for path, ops := range doc.Paths {
		for method := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	e, ok := env.srv.Handler().(*echo.Echo)
	require.True(t, ok)
	var registered []string
	for _, r := range e.Routes() {
		path := r.Path
		for _, seg := range strings.Split(path, "/") {
			if strings.HasPrefix(seg, ":") {
				path = strings.Replace(path, seg, "{"+seg[1:]+"}", 1)
			}
		}
		registered = append(registered, r.Method+" "+path)
	}
	slices.Sort(documented)
	slices.Sort(registered)
	assert.Equal(t, registered, documented, "routes and openapi.json must match both ways")
	assert.Len(t, registered, 12)
}

func TestOpenAPIReferencesResolve(t *testing.T) {
	raw := api.OpenAPI()
	var doc openAPIDoc
	require.NoError(t, json.Unmarshal(raw, &doc))
	var walk func(v any)
	refs := 0
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				refs++
				parts := strings.Split(strings.TrimPrefix(ref, "#/components/"), "/")
				require.Len(t, parts, 2, ref)
				var table map[string]json.RawMessage
				switch parts[0] {
				case "parameters":
					table = doc.Comps.Parameters
				case "schemas":
					table = doc.Comps.Schemas
				case "responses":
					table = doc.Comps.Responses
				}
				assert.Contains(t, table, parts[1], "dangling %s", ref)
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	var tree any
	require.NoError(t, json.Unmarshal(raw, &tree))
	walk(tree)
	assert.Greater(t, refs, 50)

	// Limits the handlers enforce are the ones documented.
	var limits map[string]struct {
		Schema struct {
			Maximum int             `json:"maximum"`
			Default json.RawMessage `json:"default"`
		} `json:"schema"`
	}
	b, err := json.Marshal(doc.Comps.Parameters)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &limits))
	assert.Equal(t, 1000, limits["LatestLimit"].Schema.Maximum)
	assert.Equal(t, "10", string(limits["LatestLimit"].Schema.Default))
	assert.Equal(t, 10000, limits["RangeLimit"].Schema.Maximum)
	assert.Equal(t, "1000", string(limits["RangeLimit"].Schema.Default))
	assert.Equal(t, 1000, limits["DevicesLimit"].Schema.Maximum)
	assert.Equal(t, "100", string(limits["DevicesLimit"].Schema.Default))
}
