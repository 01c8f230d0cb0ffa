package promapi

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	promclient "github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPrometheusClientDecodesErrors serves the API on loopback and reads an
// error answer with Prometheus' own Go client, the way Grafana reads it: the
// type arrives in the errorType field and the message in error.
func TestPrometheusClientDecodesErrors(t *testing.T) {
	a, err := New(Config{Source: fleetSource(), Now: func() time.Time { return attrNow }})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	c, err := promclient.NewClient(promclient.Config{Address: "http://" + ln.Addr().String()})
	require.NoError(t, err)
	api := v1.NewAPI(c)

	_, _, _, err = api.Query(context.Background(), "load{", attrNow)
	require.Error(t, err)
	var perr *v1.Error
	require.True(t, errors.As(err, &perr), "a Prometheus API error, got %T: %v", err, err)
	assert.Equal(t, v1.ErrBadData, perr.Type)
	assert.Contains(t, perr.Msg, "parse error")

	// Go's decoder matches field names without regard to case; clients
	// in other languages do not, so the field is spelt exactly.
	resp, err := http.Get("http://" + ln.Addr().String() + "/api/v1/query?query=load%7B")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(body), `"errorType":"bad_data"`)

	// A good query still decodes, so the client reads this server at all.
	_, _, _, err = api.Query(context.Background(), "load", attrNow)
	require.NoError(t, err)
}
