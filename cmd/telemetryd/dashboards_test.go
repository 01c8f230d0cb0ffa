package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// dashEnv is a real store on a temp dir behind a real API server on
// loopback, wired exactly as the service wires it.
type dashEnv struct {
	st   *store.Store
	srv  *api.Server
	dir  string
	base string
	now  time.Time
	auth api.Tokens // nil: no auth file
	// queryTimeout overrides the API's query deadline when set.
	queryTimeout time.Duration
	// maxOpenTables overrides the store's cold-table cap when set.
	maxOpenTables int
}

// newDashEnv opens the store and the API with the clock fixed at now.
func newDashEnv(t testing.TB, now time.Time) *dashEnv {
	t.Helper()
	e := &dashEnv{dir: t.TempDir(), now: now}
	e.open(t)
	t.Cleanup(func() { e.close() })
	return e
}

func (e *dashEnv) open(t testing.TB) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	now := func() time.Time { return e.now }
	sopts := store.DefaultOptions()
	sopts.Logger = log
	sopts.Now = now
	if e.maxOpenTables > 0 {
		sopts.MaxOpenTables = e.maxOpenTables
	}
	st, err := store.Open(context.Background(), e.dir, sopts)
	require.NoError(t, err)
	acfg := api.Config{Addr: "127.0.0.1:0", Reader: st, Logger: log, Now: now, Auth: e.auth, QueryTimeout: e.queryTimeout}
	require.NoError(t, acfg.WithDashboards(st))
	srv, err := api.New(acfg)
	require.NoError(t, err)
	require.NoError(t, srv.Open())
	e.st, e.srv, e.base = st, srv, "http://"+srv.Addr()
}

func (e *dashEnv) close() {
	if e.srv != nil {
		_ = e.srv.Close(context.Background())
		_ = e.st.Close()
		e.srv, e.st = nil, nil
	}
}

// reopen closes the API and the store (which merges every device's
// open blocks into sealed ones) and opens both again.
func (e *dashEnv) reopen(t testing.TB) {
	t.Helper()
	e.close()
	e.open(t)
}

// write stores rs and fails the test on error.
func (e *dashEnv) write(t testing.TB, rs ...buckets.Reading) {
	t.Helper()
	require.NoError(t, e.st.Write(context.Background(), rs))
}

// getJSON fetches path with query q and decodes a 200 answer into out;
// it returns the status and the body.
func (e *dashEnv) getJSON(t testing.TB, path string, q url.Values, out any) (int, []byte) {
	t.Helper()
	u := e.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil && resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(body, out), "body %s", body)
	}
	return resp.StatusCode, body
}

// newReading builds a reading with its values sorted by name.
func newReading(dev string, k buckets.Ticks, fields ...buckets.Field) buckets.Reading {
	r := buckets.Reading{Device: buckets.DeviceID(dev), Ticks: k, Values: fields}
	if _, ok := buckets.SortValues(r.Values); !ok {
		panic("duplicate value name")
	}
	return r
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
