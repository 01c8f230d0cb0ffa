package api_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// newOpenServer starts a Server on 127.0.0.1:0 with Open.
func newOpenServer(t *testing.T, cfg api.Config) *api.Server {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	cfg.Logger = quietLogger
	srv, err := api.New(cfg)
	require.NoError(t, err)
	require.NoError(t, srv.Open())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, srv.Close(ctx))
	})
	return srv
}

// quietLogger drops logs of servers whose logs a test does not read.
var quietLogger = slog.New(slog.DiscardHandler)

// rawGet sends "GET <target> HTTP/1.1" byte for byte, so no client
// library cleans or re-encodes the path.
func rawGet(t *testing.T, addr, target string) response {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = io.WriteString(conn, "GET "+target+" HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
	require.NoError(t, err)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{res.StatusCode, res.Header, body}
}

func TestOpenServesAndCloseStops(t *testing.T) {
	srv, err := api.New(api.Config{Addr: "127.0.0.1:0", Reader: newFakeReader(), Logger: quietLogger})
	require.NoError(t, err)
	assert.Empty(t, srv.Addr(), "no address before Open")
	require.NoError(t, srv.Open())
	addr := srv.Addr()
	require.NotEmpty(t, addr)
	assert.NotEqual(t, "127.0.0.1:0", addr)
	assert.Error(t, srv.Open(), "a second Open fails")

	res := rawGet(t, addr, "/healthz")
	assert.Equal(t, http.StatusOK, res.status)
	assert.JSONEq(t, `{"status":"ok"}`, string(res.body))

	require.NoError(t, srv.Close(context.Background()))
	require.NoError(t, srv.Close(context.Background()), "Close is idempotent")
	_, err = net.DialTimeout("tcp", addr, time.Second)
	assert.Error(t, err, "nothing listens after Close")
}

func TestCloseWithoutOpen(t *testing.T) {
	srv, err := api.New(api.Config{Reader: newFakeReader()})
	require.NoError(t, err)
	assert.NoError(t, srv.Close(context.Background()))
}

func TestCloseWaitsForInFlightRequests(t *testing.T) {
	reader := newFakeReader()
	reader.gate, reader.entered = make(chan struct{}), make(chan struct{}, 1)
	srv, err := api.New(api.Config{Addr: "127.0.0.1:0", Reader: reader, Logger: quietLogger})
	require.NoError(t, err)
	require.NoError(t, srv.Open())
	done := make(chan response, 1)
	go func() { done <- rawGetNoT(srv.Addr(), "/v1/devices/dev-1/readings/latest") }()
	<-reader.entered
	closed := make(chan error, 1)
	go func() { closed <- srv.Close(context.Background()) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a request was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(reader.gate)
	require.NoError(t, <-closed)
	assert.Equal(t, http.StatusOK, (<-done).status, "the in-flight request completed")
}

// rawGetNoT is rawGet for goroutines (status 0 on failure).
func rawGetNoT(addr, target string) response {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return response{}
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET "+target+" HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return response{}
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return response{res.StatusCode, res.Header, body}
}

func TestNewRejectsBadConfig(t *testing.T) {
	_, err := api.New(api.Config{})
	assert.Error(t, err, "Reader is required")
	_, err = api.New(api.Config{Reader: newFakeReader(), MaxInFlight: -1})
	assert.Error(t, err)
}

func TestBadDeviceIDsOverRawHTTP(t *testing.T) {
	reader := newFakeReader()
	srv := newOpenServer(t, api.Config{Reader: reader})
	long := strings.Repeat("a", 65)
	for _, target := range []string{
		"/v1/devices/..%2Fetc/readings/latest",
		"/v1/devices/..%2f..%2fetc/readings",
		"/v1/devices/a%2Fb/readings/" + contractTS,
		"/v1/devices/../readings/latest",
		"/v1/devices/a.b/readings/latest",
		"/v1/devices/a.b/readings",
		"/v1/devices/" + long + "/readings/latest",
		"/v1/devices/%00/readings/latest",
		"/v1/devices/-a/readings/latest",
		// (A malformed escape like %zz never gets here: net/http answers
		// 400 itself.)
	} {
		t.Run(target, func(t *testing.T) {
			res := rawGet(t, srv.Addr(), target)
			requireError(t, res, http.StatusBadRequest, "invalid_argument", "device")
		})
	}
	assert.Empty(t, reader.latest)
	assert.Empty(t, reader.rangeCalls())
	assert.Empty(t, reader.gets)

	t.Run("64 characters are fine", func(t *testing.T) {
		res := rawGet(t, srv.Addr(), "/v1/devices/"+strings.Repeat("a", 64)+"/readings/latest")
		assert.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	})
	t.Run("percent-encoded letters are decoded", func(t *testing.T) {
		res := rawGet(t, srv.Addr(), "/v1/devices/dev%2D1/readings/latest")
		require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
		assert.Equal(t, "dev-1", res.json(t)["device"])
	})
}

func TestTooManyInFlight(t *testing.T) {
	env := newTestEnv(t, func(c *api.Config) { c.MaxInFlight, c.ClientShares = 2, 1 })
	env.reader.gate, env.reader.entered = make(chan struct{}), make(chan struct{}, 2)
	var wg sync.WaitGroup
	results := make(chan int, 2)
	for range 2 {
		wg.Go(func() {
			results <- rawGetNoT(strings.TrimPrefix(env.url, "http://"), "/v1/devices/dev-1/readings/latest").status
		})
	}
	<-env.reader.entered
	<-env.reader.entered

	res := env.get(t, "/v1/devices/dev-1/readings/latest")
	requireError(t, res, http.StatusTooManyRequests, "resource_exhausted", "request")
	assert.Equal(t, "1", res.header.Get("Retry-After"))
	assert.Equal(t, http.StatusOK, env.get(t, "/healthz").status, "probes are not limited")

	close(env.reader.gate)
	wg.Wait()
	close(results)
	for s := range results {
		assert.Equal(t, http.StatusOK, s)
	}
	assert.Equal(t, http.StatusOK, env.get(t, "/v1/tables").status, "slots are released")
}

func TestQueryTimeout(t *testing.T) {
	env := newTestEnv(t, func(c *api.Config) { c.QueryTimeout = 20 * time.Millisecond })
	env.reader.gate = make(chan struct{}) // never opened: the call waits for the deadline
	res := env.get(t, "/v1/devices/dev-1/readings?limit=5")
	requireError(t, res, http.StatusServiceUnavailable, "unavailable", "request")
	assert.NotEmpty(t, res.header.Get("Retry-After"))
}

func TestReadyz(t *testing.T) {
	var mu sync.Mutex
	var readyErr error
	env := newTestEnv(t, func(c *api.Config) {
		c.Ready = func(ctx context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			return readyErr
		}
	})
	res := env.get(t, "/readyz")
	require.Equal(t, http.StatusOK, res.status)
	assert.JSONEq(t, `{"status":"ready"}`, string(res.body))

	mu.Lock()
	readyErr = errors.New("nats: not connected")
	mu.Unlock()
	msg := requireError(t, env.get(t, "/readyz"), http.StatusServiceUnavailable, "unavailable", "")
	assert.Contains(t, msg, "nats: not connected")

	noReady := newTestEnv(t)
	assert.Equal(t, http.StatusOK, noReady.get(t, "/readyz").status, "no Ready func: always ready")
}

func TestHealthz(t *testing.T) {
	env := newTestEnv(t)
	res := env.get(t, "/healthz")
	require.Equal(t, http.StatusOK, res.status)
	assert.JSONEq(t, `{"status":"ok"}`, string(res.body))
}

func TestMetricsEndpoint(t *testing.T) {
	env := newTestEnv(t, func(c *api.Config) {
		c.Metrics = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = io.WriteString(w, "# HELP up\nup 1\n")
		})
	})
	res := env.get(t, "/metrics")
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, "# HELP up\nup 1\n", string(res.body))
	assert.Equal(t, "text/plain; version=0.0.4", res.header.Get("Content-Type"))

	none := newTestEnv(t)
	requireError(t, none.get(t, "/metrics"), http.StatusNotFound, "not_found", "path")
}

func TestUnknownRoutesAnswerJSON(t *testing.T) {
	env := newTestEnv(t)
	requireError(t, env.get(t, "/v2/nothing"), http.StatusNotFound, "not_found", "path")
	requireError(t, env.get(t, "/v1/devices/dev-1/values"), http.StatusNotFound, "not_found", "path")
	requireError(t, env.do(t, http.MethodPost, "/v1/tables"), http.StatusMethodNotAllowed, "method_not_allowed", "method")
	requireError(t, env.get(t, "/v1/retention/run"), http.StatusMethodNotAllowed, "method_not_allowed", "method")
}

func TestRequestBodyLimit(t *testing.T) {
	env := newTestEnv(t)
	post := func(n int, chunked bool) response {
		var body io.Reader = strings.NewReader(strings.Repeat("x", n))
		if chunked {
			body = io.MultiReader(body) // hides the length: sent chunked
		}
		req, err := http.NewRequest(http.MethodPost, env.url+"/v1/retention/run?dry_run=true", body)
		require.NoError(t, err)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return response{res.StatusCode, res.Header, b}
	}
	assert.Equal(t, http.StatusOK, post(api.MaxBodyBytes, false).status, "exactly 1 MiB is accepted")
	requireError(t, post(api.MaxBodyBytes+1, false), http.StatusRequestEntityTooLarge, "payload_too_large", "body")
	assert.Len(t, env.admin.runs, 1, "the oversized request never reached the handler")
	assert.Equal(t, http.StatusOK, post(10, true).status)
}

// errSecret is a reader error whose text must never reach a client.
var errSecret = errors.New("open /var/lib/telemetry/secret-dir/000042.vlog: input/output error")

func TestInternalErrorsDoNotLeak(t *testing.T) {
	env := newTestEnv(t)
	env.reader.err = errSecret
	for _, path := range []string{
		"/v1/devices/dev-1/readings/latest", "/v1/devices/dev-1/readings", "/v1/devices/dev-1/readings/" + contractTS,
		"/v1/devices", "/v1/tables",
	} {
		t.Run(path, func(t *testing.T) {
			res := env.get(t, path)
			msg := requireError(t, res, http.StatusInternalServerError, "internal", "")
			assert.Equal(t, "internal error", msg)
			assert.NotContains(t, string(res.body), "secret")
			assert.NotContains(t, string(res.body), "vlog")
		})
	}
	assert.Equal(t, 5, strings.Count(env.logs.String(), "secret-dir"), "each failure is logged once: %s", env.logs.String())
}

func TestPanicsBecome500(t *testing.T) {
	env := newTestEnv(t)
	env.reader.panics = "boom: secret state"
	res := env.get(t, "/v1/devices/dev-1/readings/latest")
	msg := requireError(t, res, http.StatusInternalServerError, "internal", "")
	assert.Equal(t, "internal error", msg)
	assert.NotContains(t, string(res.body), "boom")
	logs := env.logs.String()
	assert.Equal(t, 1, strings.Count(logs, "boom: secret state"), "logged once: %s", logs)
	assert.Contains(t, logs, "stack=")
	env.reader.panics = ""
	assert.Equal(t, http.StatusOK, env.get(t, "/v1/devices/dev-1/readings/latest").status, "the server keeps serving")
}

// partitionDown is an unavailable error that words itself for the
// client, as a cluster's router words a partition no owner answered.
type partitionDown struct{ p int }

func (e partitionDown) Error() string {
	return fmt.Sprintf("partition %d: http://10.0.0.7:8080 refused", e.p)
}
func (e partitionDown) Unwrap() error { return buckets.ErrUnavailable }
func (e partitionDown) ClientMessage() string {
	return fmt.Sprintf("partition %d: no owner answered; retry later", e.p)
}

func TestSentinelErrorMapping(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		status int
		code   string
		param  string
	}{
		{"unavailable", &wrapped{"table 2026-11-22 is being dropped", buckets.ErrUnavailable}, http.StatusServiceUnavailable, "unavailable", "store"},
		{"invalid argument", &wrapped{"too wide for this store", buckets.ErrInvalidArgument}, http.StatusBadRequest, "invalid_argument", "request"},
		{"validation error", buckets.Invalid(buckets.CodeInvalidDevice, -1, "device", "unknown shape"), http.StatusBadRequest, "invalid_argument", "device"},
		{"unknown device", &wrapped{"device dev-1", buckets.ErrNotFound}, http.StatusNotFound, "not_found", "device"},
		{"deadline", &wrapped{"scan 2026-11-22", context.DeadlineExceeded}, http.StatusServiceUnavailable, "unavailable", "request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t)
			env.reader.err = tt.err
			res := env.get(t, "/v1/devices/dev-1/readings/latest")
			msg := requireError(t, res, tt.status, tt.code, tt.param)
			if tt.status >= 500 {
				assert.NotContains(t, msg, "2026-11-22", "store details stay out of 5xx")
				assert.Equal(t, "1", res.header.Get("Retry-After"))
				assert.Contains(t, env.logs.String(), "2026-11-22", "but they are logged")
			}
		})
	}
	t.Run("a partition no owner answered is named", func(t *testing.T) {
		env := newTestEnv(t)
		env.reader.err = fmt.Errorf("latest dev-1: %w", partitionDown{3})
		res := env.get(t, "/v1/devices/dev-1/readings/latest")
		msg := requireError(t, res, http.StatusServiceUnavailable, "unavailable", "cluster")
		assert.Equal(t, "cluster: partition 3: no owner answered; retry later", msg)
		assert.NotContains(t, msg, "10.0.0.7", "node addresses stay out")
	})
	t.Run("damaged table names its day, not its files", func(t *testing.T) {
		env := newTestEnv(t)
		day, err := buckets.ParseDay("2026-11-21")
		require.NoError(t, err)
		env.reader.err = fmt.Errorf("latest dev-1: %w", &buckets.TableError{Day: day,
			Reason: "damaged; other days are unaffected", Err: errors.New("/data/tables/2026-11-21/000001.sst: bad magic")})
		res := env.get(t, "/v1/devices/dev-1/readings/latest")
		msg := requireError(t, res, http.StatusServiceUnavailable, "unavailable", "store")
		assert.Equal(t, "store: table 2026-11-21: damaged; other days are unaffected", msg)
		assert.Contains(t, env.logs.String(), "000001.sst", "the cause is logged")
	})
}
