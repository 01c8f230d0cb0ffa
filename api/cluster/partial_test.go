package cluster

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// trailingX is a node X that serves partitions 0 and 1 and whose copy of
// partition 1 trails its stream (no other owner answers it without
// trailing, so X still does), and the URL of its node-to-node API.
func trailingX(t *testing.T) (*memLocal, string) {
	t.Helper()
	x := &memLocal{rs: []buckets.Reading{reading("d0", 5, 0), reading("d1", 10, 1)}}
	r, err := New(Config{Local: x, Membership: view{}, Credential: testCredential, Trailing: servesOnly(1)})
	require.NoError(t, err)
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(srv.Close)
	return x, srv.URL
}

// TestAnswersFromATrailingCopyAreMarkedPartial: an answer that read a
// partition from a copy trailing its stream, through another node or on
// the node itself, a single device's or a list's, carries the partial
// warning naming that partition, and no other; an answer that read no
// trailing copy carries none. Through the public API the warning is a
// Telemetry-Warning header and in the answer's "warnings".
func TestAnswersFromATrailingCopyAreMarkedPartial(t *testing.T) {
	x, xURL := trailingX(t)
	asker, err := New(Config{Local: &memLocal{}, Credential: testCredential, Membership: view{owners: map[int][]Peer{
		0: {{Node: "x", URL: xURL}}, 1: {{Node: "x", URL: xURL}}}}})
	require.NoError(t, err)
	self, err := New(Config{Local: x, Credential: testCredential, Trailing: servesOnly(1), Membership: view{owners: map[int][]Peer{
		0: {{Node: "x", Self: true}}, 1: {{Node: "x", Self: true}}}}})
	require.NoError(t, err)

	for name, r := range map[string]*Router{"through another node": asker, "on the node itself": self} {
		ctx, w := buckets.WithWarnings(context.Background())
		_, err := r.Latest(ctx, "d1", 1)
		require.NoError(t, err, name)
		assert.Equal(t, []string{PartialWarning(1)}, w.List(), "%s: a read of the trailing partition", name)

		ctx, w = buckets.WithWarnings(context.Background())
		_, err = r.Range(ctx, buckets.RangeQuery{Device: "d0", Limit: 10})
		require.NoError(t, err, name)
		assert.Empty(t, w.List(), "%s: a read of a partition that does not trail", name)

		ctx, w = buckets.WithWarnings(context.Background())
		devs, _, err := r.Devices(ctx, buckets.DeviceQuery{Limit: 10})
		require.NoError(t, err, name)
		assert.Len(t, devs, 2, name)
		assert.Equal(t, []string{PartialWarning(1)}, w.List(), "%s: a list over both partitions", name)
	}

	// Through the public API of the asking node.
	srv, err := api.New(api.Config{Reader: asker})
	require.NoError(t, err)
	get := func(path string) (http.Header, map[string]any) {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		require.Equal(t, http.StatusOK, rec.Code, path)
		body, err := io.ReadAll(rec.Body)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(body, &m), string(body))
		return rec.Header(), m
	}
	h, m := get("/v1/devices/d1/readings?from=1970-01-01T00:00:00Z&to=1970-01-02T00:00:00Z")
	assert.Equal(t, []string{PartialWarning(1)}, h.Values(HeaderWarning))
	assert.Equal(t, []any{PartialWarning(1)}, m["warnings"])
	h, m = get("/v1/devices/d0/readings?from=1970-01-01T00:00:00Z&to=1970-01-02T00:00:00Z")
	assert.Empty(t, h.Values(HeaderWarning))
	assert.NotContains(t, m, "warnings")
}
