package api_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"
)

// durationPoints collects the http.server.request.duration data points
// by (method, route, status); route is "" when the attribute is absent.
func durationPoints(t *testing.T, env *testEnv) map[[3]string]uint64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, env.metrics.Collect(context.Background(), &rm))
	out := map[[3]string]uint64{}
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "http.server.request.duration" {
				continue
			}
			found = true
			assert.Equal(t, "s", m.Unit)
			h, ok := m.Data.(metricdata.Histogram[float64])
			require.True(t, ok, "a float64 histogram")
			for _, dp := range h.DataPoints {
				method, _ := dp.Attributes.Value("http.request.method")
				route, hasRoute := dp.Attributes.Value("http.route")
				status, _ := dp.Attributes.Value("http.response.status_code")
				assert.Equal(t, 3-boolInt(!hasRoute), dp.Attributes.Len(), "only method, route, status")
				out[[3]string{method.AsString(), route.AsString(), status.String()}] += dp.Count
			}
		}
	}
	require.True(t, found, "http.server.request.duration was recorded")
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestRequestDurationMetric(t *testing.T) {
	env := newTestEnv(t)
	env.get(t, "/v1/devices/dev-1/readings/latest")
	env.get(t, "/v1/devices/dev-2/readings/latest")
	env.get(t, "/v1/devices/dev-2/readings/latest?limit=0")
	env.get(t, "/v1/devices/dev-1/readings/"+contractTS)
	env.do(t, http.MethodPost, "/v1/tables")
	env.get(t, "/no/such/path")
	env.do(t, "BREW", "/healthz")

	got := durationPoints(t, env)
	assert.Equal(t, map[[3]string]uint64{
		{"GET", "/v1/devices/{device}/readings/latest", "200"}: 2,
		{"GET", "/v1/devices/{device}/readings/latest", "400"}: 1,
		{"GET", "/v1/devices/{device}/readings/{ts}", "404"}:   1,
		{"POST", "/v1/tables", "405"}:                          1,
		{"GET", "", "404"}:                                     1, // no route: no http.route, never the raw path
		{"_OTHER", "/healthz", "405"}:                          1,
	}, got)
}

func TestServerSpans(t *testing.T) {
	env := newTestEnv(t)
	parent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	res := env.do(t, http.MethodGet, "/v1/devices/dev-1/readings/latest?limit=2", "traceparent", parent)
	require.Equal(t, http.StatusOK, res.status)
	env.reader.err = errSecret
	env.get(t, "/v1/tables")

	spans := env.spans.Ended()
	require.Len(t, spans, 2)
	s := spans[0]
	assert.Equal(t, "GET /v1/devices/{device}/readings/latest", s.Name())
	assert.Equal(t, trace.SpanKindServer, s.SpanKind())
	assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", s.SpanContext().TraceID().String(), "continues the caller's trace")
	assert.Equal(t, "00f067aa0ba902b7", s.Parent().SpanID().String())
	attrs := map[string]string{}
	for _, kv := range s.Attributes() {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	assert.Equal(t, "GET", attrs["http.request.method"])
	assert.Equal(t, "/v1/devices/{device}/readings/latest", attrs["http.route"])
	assert.Equal(t, "200", attrs["http.response.status_code"])

	failed := spans[1]
	assert.Equal(t, "GET /v1/tables", failed.Name())
	assert.Equal(t, "Error", failed.Status().Code.String())
	assert.False(t, failed.Parent().IsValid(), "no traceparent: a new trace")
}
