package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// loadOpenAPI loads the served document with kin-openapi and validates
// it against the OpenAPI 3 specification.
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.OpenAPI())
	require.NoError(t, err, "openapi.json loads")
	require.NoError(t, doc.Validate(loader.Context), "openapi.json is a valid OpenAPI 3 document")
	return doc
}

// fullTestEnv is a test server with every optional part configured, so
// that every route the server can register is registered.
func fullTestEnv(t *testing.T) *testEnv {
	t.Helper()
	return newTestEnv(t, func(c *api.Config) {
		c.Metrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			_, _ = io.WriteString(w, "# TYPE up gauge\nup 1\n")
		})
		c.Aggregator = fixedAggregator{}
		c.ExpiresAt = func(tables []buckets.TableInfo, _ time.Time) []time.Time {
			out := make([]time.Time, len(tables))
			for i, tb := range tables {
				out[i] = tb.Day.End().Time().Add(buckets.DefaultRetention)
			}
			return out
		}
	})
}

// fixedAggregator answers every aggregate query with two buckets and
// says more remain.
type fixedAggregator struct{}

func (fixedAggregator) Aggregate(_ context.Context, q buckets.AggregateQuery) (buckets.AggregatePage, error) {
	sm := buckets.Summary{}
	sm.Add(q.From, 20.5)
	sm.Add(q.From+1, 21.5)
	b := buckets.AggregateBucket{Start: q.From - q.From%q.Interval, Values: []buckets.NamedSummary{{Name: "temp", Summary: sm}}}
	b2 := b
	b2.Start += q.Interval
	return buckets.AggregatePage{Buckets: []buckets.AggregateBucket{b, b2}, More: true}, nil
}

// registeredRoutes lists "METHOD /path/{param}" for every route the
// server registered.
func registeredRoutes(t *testing.T, srv *api.Server) []string {
	t.Helper()
	e, ok := srv.Handler().(*echo.Echo)
	require.True(t, ok, "the handler is the Echo instance")
	var out []string
	for _, r := range e.Routes() {
		segs := strings.Split(r.Path, "/")
		for i, s := range segs {
			switch {
			case strings.HasPrefix(s, ":"):
				segs[i] = "{" + s[1:] + "}"
			case s == "*":
				segs[i] = "{path}"
			}
		}
		out = append(out, r.Method+" "+strings.Join(segs, "/"))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// documentedRoutes lists "METHOD /path/{param}" for every operation in
// the document.
func documentedRoutes(doc *openapi3.T) []string {
	var out []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			out = append(out, method+" "+path)
		}
	}
	slices.Sort(out)
	return out
}

// TestOpenAPIDocumentsEveryRoute fails when a route is registered
// without an operation in openapi.json, or documented but not served.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	doc := loadOpenAPI(t)
	env := fullTestEnv(t)
	registered := registeredRoutes(t, env.srv)
	documented := documentedRoutes(doc)
	for _, r := range registered {
		assert.Contains(t, documented, r, "route %s is served but not described in api/openapi.json", r)
	}
	for _, d := range documented {
		assert.Contains(t, registered, d, "operation %s is described in api/openapi.json but not served", d)
	}

	res := env.get(t, "/openapi.json")
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, "application/json", res.header.Get("Content-Type"))
	assert.Equal(t, api.OpenAPI(), res.body, "the served document is the embedded one")
}

// TestOpenAPILimitsMatchHandlers checks that the documented limits are
// the ones the handlers enforce, at the boundary.
func TestOpenAPILimitsMatchHandlers(t *testing.T) {
	doc := loadOpenAPI(t)
	env := fullTestEnv(t)
	for _, tc := range []struct {
		param, path string
		max         float64
		def         any
	}{
		{"LatestLimit", "/v1/devices/dev-1/readings/latest", 1000, float64(10)},
		{"RangeLimit", "/v1/devices/dev-1/readings", 10000, float64(1000)},
		{"DevicesLimit", "/v1/devices", 1000, float64(100)},
	} {
		p := doc.Components.Parameters[tc.param]
		require.NotNil(t, p, tc.param)
		s := p.Value.Schema.Value
		require.NotNil(t, s.Max, tc.param)
		assert.Equal(t, tc.max, *s.Max, tc.param)
		assert.Equal(t, tc.def, s.Default, tc.param)
		assert.NotEqual(t, http.StatusBadRequest, env.get(t, tc.path+q("limit", ftoa(tc.max))).status, "%s: limit=max is accepted", tc.param)
		requireError(t, env.get(t, tc.path+q("limit", ftoa(tc.max+1))), http.StatusBadRequest, "invalid_argument", "limit")
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// exchange is one request to the test server and what came back.
type exchange struct {
	name   string
	method string
	path   string
	header []string
	body   string // sent as application/json when set
	setup  func(env *testEnv)
	status int
}

// TestOpenAPIResponsesValidate sends real requests to a test server,
// one or more per documented operation and status, and validates each
// request and response against the document: status documented for the
// operation, content type, and body against its schema.
func TestOpenAPIResponsesValidate(t *testing.T) {
	doc := loadOpenAPI(t)
	router, err := gorillamux.NewRouter(doc)
	require.NoError(t, err)

	d1 := mustTicks(t, "2026-11-22T10:00:00Z")
	seed := func(env *testEnv) {
		for i := range 5 {
			env.reader.add(buckets.Reading{Device: "dev-1", Ticks: d1 + buckets.Ticks(i)*buckets.TicksPerSecond, Values: []buckets.Field{
				{Name: "temp", Value: buckets.Float(21.5 + float64(i))},
				{Name: "count", Value: buckets.Int(int64(i))},
				{Name: "ok", Value: buckets.Bool(i%2 == 0)},
				{Name: "state", Value: buckets.String("run <&> \u2028")},
			}})
		}
		env.reader.devices = []buckets.DeviceInfo{{Device: "dev-1", FirstSeen: d1, LastSeen: d1 + 4*buckets.TicksPerSecond,
			Latest: []buckets.Field{{Name: "temp", Value: buckets.Float(25.5)}, {Name: "ok", Value: buckets.Bool(true)}}},
			{Device: "dev-2", FirstSeen: d1, LastSeen: d1}}
		env.reader.setAttributes("dev-1", "fleet", "East", "model", "F-150")
		env.admin.devices = map[buckets.DeviceID]buckets.DeviceDelete{
			"dev-1": {Device: "dev-1", Deleted: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), Readings: 5, Tables: 1}}
		env.reader.devices = append(env.reader.devices, buckets.DeviceInfo{Device: "dev-3"})
		env.reader.setAttributes("dev-3", "fleet", "West")
		env.reader.tables = []buckets.TableInfo{{Day: mustDay(t, "2026-11-21"), SizeBytes: 1 << 20, Readings: 86400}, {Day: mustDay(t, "2026-11-22"), SizeBytes: 4096, Readings: -1}}
		env.admin.tables[mustDay(t, "2026-10-01")] = buckets.TableDrop{Day: mustDay(t, "2026-10-01"), SizeBytes: 4096, Readings: 10, Reason: "manual"}
		env.admin.report = buckets.RetentionReport{Started: testNow, Cutoff: testNow.Add(-720 * time.Hour),
			Dropped: []buckets.TableDrop{{Day: mustDay(t, "2026-10-22"), SizeBytes: 10, Readings: -1, Reason: "expired"}}, Kept: 2, BytesNow: 99}
	}
	unavailable := func(env *testEnv) { env.reader.err = &wrapped{"table 2026-11-22", buckets.ErrUnavailable} }
	broken := func(env *testEnv) { env.reader.err = io.ErrUnexpectedEOF }
	unknown := func(env *testEnv) { env.reader.err = &wrapped{"device dev-1", buckets.ErrNotFound} }
	exchanges := []exchange{
		{name: "latest", method: "GET", path: "/v1/devices/dev-1/readings/latest?limit=3&fields=temp,ok", status: 200},
		{name: "latest bad limit", method: "GET", path: "/v1/devices/dev-1/readings/latest?limit=0", status: 400},
		{name: "latest unavailable", method: "GET", path: "/v1/devices/dev-1/readings/latest", setup: unavailable, status: 503},
		{name: "latest unknown device", method: "GET", path: "/v1/devices/dev-1/readings/latest", setup: unknown, status: 404},
		{name: "range unknown device", method: "GET", path: "/v1/devices/dev-1/readings", setup: unknown, status: 404},
		{name: "latest internal", method: "GET", path: "/v1/devices/dev-1/readings/latest", setup: broken, status: 500},
		{name: "range with next", method: "GET", path: "/v1/devices/dev-1/readings?from=2026-11-22T00:00:00Z&to=2026-11-23T00:00:00Z&limit=2", status: 200},
		{name: "range asc", method: "GET", path: "/v1/devices/dev-1/readings?from=1795305600000&order=asc", status: 200},
		{name: "range bad from", method: "GET", path: "/v1/devices/dev-1/readings?from=abc", status: 400},
		{name: "range bad device", method: "GET", path: "/v1/devices/a.b/readings", status: 400},
		{name: "point", method: "GET", path: "/v1/devices/dev-1/readings/2026-11-22T10:00:01Z", status: 200},
		{name: "point missing", method: "GET", path: "/v1/devices/dev-1/readings/2026-11-22T09:00:00Z", status: 404},
		{name: "aggregates", method: "GET", path: "/v1/devices/dev-1/aggregates?from=2026-11-22T00:00:00Z&to=2026-11-22T01:00:00Z&interval=1m&fn=count,sum,min,max,avg,first,last", status: 200},
		{name: "aggregates default", method: "GET", path: "/v1/devices/dev-1/aggregates", status: 200},
		{name: "aggregates bad interval", method: "GET", path: "/v1/devices/dev-1/aggregates?interval=1ms", status: 400},
		{name: "devices", method: "GET", path: "/v1/devices?limit=1", status: 200},
		{name: "devices prefix", method: "GET", path: "/v1/devices?prefix=dev-2", status: 200},
		{name: "devices bad prefix", method: "GET", path: "/v1/devices?prefix=a/b", status: 400},
		{name: "devices match", method: "GET", path: "/v1/devices?match=" + url.QueryEscape(`{fleet="East",model=~"F-.*"}`) + "&limit=1", status: 200},
		{name: "devices silent", method: "GET", path: "/v1/devices?silent_for=10m", status: 200},
		{name: "devices bad match", method: "GET", path: "/v1/devices?match=" + url.QueryEscape(`{fleet=~"("}`), status: 400},
		{name: "device", method: "GET", path: "/v1/devices/dev-1", status: 200},
		{name: "device known by its attributes only", method: "GET", path: "/v1/devices/dev-3", status: 200},
		{name: "device unknown", method: "GET", path: "/v1/devices/dev-9", status: 404},
		{name: "device bad", method: "GET", path: "/v1/devices/a.b", status: 400},
		{name: "put attributes", method: "PUT", path: "/v1/devices/dev-1/attributes", body: `{"fleet":"East","model":"F-150"}`, status: 200},
		{name: "patch attributes", method: "PATCH", path: "/v1/devices/dev-1/attributes", body: `{"fleet":"West","model":null}`, status: 200},
		{name: "put attributes bad name", method: "PUT", path: "/v1/devices/dev-1/attributes", body: `{"fleet-id":"East"}`, status: 400},
		{name: "patch attributes bad value", method: "PATCH", path: "/v1/devices/dev-1/attributes", body: `{"fleet":""}`, status: 400},
		{name: "put attributes too large", method: "PUT", path: "/v1/devices/dev-1/attributes", body: `{"fleet":"East"` + strings.Repeat(" ", api.MaxAttributesBodyBytes) + `}`, status: 413},
		{name: "tables", method: "GET", path: "/v1/tables", status: 200},
		{name: "tables unavailable", method: "GET", path: "/v1/tables", setup: unavailable, status: 503},
		{name: "drop", method: "DELETE", path: "/v1/tables/2026-10-01", status: 200},
		{name: "drop missing", method: "DELETE", path: "/v1/tables/2026-10-02", status: 404},
		{name: "drop bad day", method: "DELETE", path: "/v1/tables/yesterday", status: 400},
		{name: "delete device", method: "DELETE", path: "/v1/devices/dev-1", status: 200},
		{name: "delete unknown device", method: "DELETE", path: "/v1/devices/dev-9", status: 404},
		{name: "delete bad device", method: "DELETE", path: "/v1/devices/-x", status: 400},
		{name: "retention dry run", method: "POST", path: "/v1/retention/run?dry_run=true", status: 200},
		{name: "retention", method: "POST", path: "/v1/retention/run", status: 200},
		{name: "retention bad flag", method: "POST", path: "/v1/retention/run?dry_run=maybe", status: 400},
		{name: "healthz", method: "GET", path: "/healthz", status: 200},
		{name: "healthz head", method: "HEAD", path: "/healthz", status: 200},
		{name: "readyz", method: "GET", path: "/readyz", status: 200},
		{name: "readyz head", method: "HEAD", path: "/readyz", status: 200},
		{name: "metrics", method: "GET", path: "/metrics", status: 200},
		{name: "openapi", method: "GET", path: "/openapi.json", status: 200},
	}
	for _, ex := range exchanges {
		t.Run(ex.name, func(t *testing.T) {
			env := fullTestEnv(t)
			seed(env)
			if ex.setup != nil {
				ex.setup(env)
			}
			validateExchange(t, env, router, ex)
		})
	}

	t.Run("aggregates without aggregator", func(t *testing.T) {
		env := newTestEnv(t)
		validateExchange(t, env, router, exchange{method: "GET", path: "/v1/devices/dev-1/aggregates", status: 501})
	})
	t.Run("attributes without attributes", func(t *testing.T) {
		env := newTestEnv(t, func(c *api.Config) { c.Attributes = nil })
		validateExchange(t, env, router, exchange{method: "GET", path: "/v1/devices/dev-1", status: 501})
		validateExchange(t, env, router, exchange{method: "PATCH", path: "/v1/devices/dev-1/attributes", body: `{"fleet":"East"}`, status: 501})
	})
	t.Run("admin without admin", func(t *testing.T) {
		env := newTestEnv(t, func(c *api.Config) { c.Admin = nil })
		validateExchange(t, env, router, exchange{method: "POST", path: "/v1/retention/run", status: 501})
	})
	t.Run("not ready", func(t *testing.T) {
		env := newTestEnv(t, func(c *api.Config) { c.Ready = func(context.Context) error { return io.EOF } })
		validateExchange(t, env, router, exchange{method: "GET", path: "/readyz", status: 503})
		validateExchange(t, env, router, exchange{method: "HEAD", path: "/readyz", status: 503})
	})
	t.Run("routes of the other parts, unconfigured", func(t *testing.T) {
		env := newTestEnv(t)
		for _, ex := range []exchange{
			{method: "GET", path: "/ui/", status: 200},
			{method: "GET", path: "/ui", status: 301},
			{method: "GET", path: "/", status: 302},
			{method: "GET", path: "/ui/app.js", status: 200},
			{method: "GET", path: "/ui/style.css", status: 200},
			{method: "GET", path: "/ui/nothing.js", status: 404},
			{method: "GET", path: "/api/v1/labels", status: 501},
			{method: "GET", path: "/api/v1/query?query=up", status: 501},
			{method: "GET", path: "/api/v1/status/buildinfo", status: 501},
			{method: "GET", path: "/api/v1/metadata", status: 501},
			{method: "POST", path: "/write?db=x", status: 501},
			{method: "POST", path: "/api/v2/write?bucket=x", status: 501},
		} {
			t.Run(ex.method+" "+ex.path, func(t *testing.T) { validateExchange(t, env, router, ex) })
		}
	})
	t.Run("metrics off", func(t *testing.T) {
		env := newTestEnv(t)
		validateExchange(t, env, router, exchange{method: "GET", path: "/metrics", status: 404})
	})

	// Answers that no operation owns (unknown path, wrong method) still
	// have the documented error body.
	errSchema := doc.Components.Schemas["Error"].Value
	env := fullTestEnv(t)
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/v2/nothing", http.StatusNotFound},
		{"PUT", "/v1/tables", http.StatusMethodNotAllowed},
		{"HEAD", "/v1/tables", http.StatusMethodNotAllowed},
	} {
		res := env.do(t, tc.method, tc.path)
		require.Equal(t, tc.status, res.status, "%s %s", tc.method, tc.path)
		assert.Equal(t, "application/json", res.header.Get("Content-Type"))
		if tc.method != http.MethodHead {
			var body any
			require.NoError(t, decodeJSON(res.body, &body))
			assert.NoError(t, errSchema.VisitJSON(body), "%s %s: %s", tc.method, tc.path, res.body)
		}
	}
}

func init() {
	// The built-in page's files are text; validate them as strings.
	text := func(body io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
		b, err := io.ReadAll(body)
		return string(b), err
	}
	for _, ct := range []string{"text/html", "text/css", "text/javascript", "application/javascript"} {
		openapi3filter.RegisterBodyDecoder(ct, text)
	}
}

// noRedirects is a client that reports redirects instead of following
// them.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// validateExchange sends ex to env and validates the request and the
// response against the document.
func validateExchange(t *testing.T, env *testEnv, router routers.Router, ex exchange) {
	t.Helper()
	hreq, err := http.NewRequest(ex.method, env.url+ex.path, bodyOf(ex))
	require.NoError(t, err)
	for i := 0; i+1 < len(ex.header); i += 2 {
		hreq.Header.Set(ex.header[i], ex.header[i+1])
	}
	if ex.body != "" {
		hreq.Header.Set("Content-Type", "application/json")
	}
	hres, err := noRedirects.Do(hreq)
	require.NoError(t, err)
	body, err := io.ReadAll(hres.Body)
	hres.Body.Close()
	require.NoError(t, err)
	res := response{hres.StatusCode, hres.Header, body}
	require.Equal(t, ex.status, res.status, "%s %s: %s", ex.method, ex.path, res.body)

	req, err := http.NewRequest(ex.method, "http://localhost"+ex.path, bodyOf(ex))
	require.NoError(t, err)
	for i := 0; i+1 < len(ex.header); i += 2 {
		req.Header.Set(ex.header[i], ex.header[i+1])
	}
	if ex.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	route, pathParams, err := router.FindRoute(req)
	require.NoError(t, err, "%s %s has no operation in openapi.json", ex.method, ex.path)
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true,
		AuthenticationFunc: openapi3filter.NoopAuthenticationFunc} // authorization is the server's job, tested apart
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: pathParams, Route: route, Options: opts}
	if ex.status < 400 {
		// A request the server accepts must be one the document allows.
		assert.NoError(t, openapi3filter.ValidateRequest(context.Background(), in), "request %s %s", ex.method, ex.path)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: res.status, Header: res.header, Options: opts}
	out.SetBodyBytes(res.body)
	assert.NoError(t, openapi3filter.ValidateResponse(context.Background(), out), "%s %s -> %d %s", ex.method, ex.path, res.status, res.body)
}

func decodeJSON(b []byte, v any) error { return json.Unmarshal(b, v) }

// bodyOf is the request body of ex (nil without one).
func bodyOf(ex exchange) io.Reader {
	if ex.body == "" {
		return nil
	}
	return strings.NewReader(ex.body)
}
