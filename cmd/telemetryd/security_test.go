package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/cmd/internal/authcli"
	"github.com/telemetryd/telemetryd/ingest/natsembed"
)

func TestAuthCommand(t *testing.T) {
	f := newAuthFixture(t, []string{"dev-1"}, "grafana:read:sim-*,lab-?")
	secret := f.devices["dev-1"]
	assert.GreaterOrEqual(t, len(secret), 43, "at least 128 random bits (256 here)")
	data, err := os.ReadFile(f.path)
	require.NoError(t, err)
	assert.NotContains(t, string(data), secret, "the secret is never stored")
	assert.NotContains(t, string(data), f.tokens["grafana"])
	assert.Contains(t, string(data), auth.HashSecret(secret))
	st, err := os.Stat(f.path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	list := authCLI(t, f.path, "list")
	assert.Regexp(t, `(?m)^device\s+dev-1\s`, list)
	assert.Regexp(t, `(?m)^token\s+grafana\s+read\s+sim-\*,lab-\?$`, list)
	assert.NotContains(t, list, "sha256")

	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := authcli.Run(append(args, "-auth-file", f.path), func(string) string { return "" }, &out, &errb)
		return code, errb.String()
	}
	code, msg := run("add-device", "dev-1")
	assert.Equal(t, 1, code)
	assert.Contains(t, msg, "-replace")
	rotated := authCLI(t, f.path, "add-device", "dev-1", "-replace")
	assert.NotEqual(t, secret, rotated)
	file, err := auth.Load(f.path)
	require.NoError(t, err)
	assert.True(t, auth.Compile(file).Device("dev-1", rotated))
	assert.False(t, auth.Compile(file).Device("dev-1", secret), "the old secret stops working")

	code, msg = run("add-token", "x", "-scopes", "root")
	assert.Equal(t, 1, code)
	assert.Contains(t, msg, `scope "root"`)
	code, msg = run("add-device", "bad.id")
	assert.Equal(t, 1, code)
	assert.Contains(t, msg, "bad.id")
	authCLI(t, f.path, "revoke", "grafana")
	assert.NotContains(t, authCLI(t, f.path, "list"), "grafana")
	code, msg = run("revoke", "grafana")
	assert.Equal(t, 1, code)
	assert.Contains(t, msg, `no device or token named "grafana"`)
}

func TestStartRefusesExposedListenersWithoutAuth(t *testing.T) {
	for _, tc := range []struct{ flag, addr string }{
		{"-http-addr", "0.0.0.0:0"},
		{"-http-addr", ":0"},
		{"-nats-listen", "0.0.0.0:0"},
		{"-mqtt-listen", "0.0.0.0:0"},
		{"-pprof-addr", "[::]:0"},
	} {
		t.Run(tc.flag+"="+tc.addr, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := []string{"-data-dir", t.TempDir(), "-http-addr", "127.0.0.1:0", "-nats-listen", "127.0.0.1:0", "-mqtt-listen", "127.0.0.1:0", tc.flag, tc.addr}
			code := run(t.Context(), args, func(string) string { return "" }, &out, &errb)
			assert.Equal(t, 2, code)
			assert.Contains(t, errb.String(), tc.flag+` "`+tc.addr+`" listens beyond loopback`)
			assert.Contains(t, errb.String(), "add -auth-file FILE")
		})
	}
	t.Run("-insecure starts", func(t *testing.T) {
		var out bytes.Buffer
		errb := &lockedBuffer{}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"-data-dir", t.TempDir(), "-http-addr", "0.0.0.0:0", "-nats-listen", "0.0.0.0:0",
				"-mqtt-listen", "0.0.0.0:0", "-insecure"},
				func(string) string { return "" }, &out, errb)
		}()
		var code int
		exited := false
		waitFor(t, 20*time.Millisecond, func() bool {
			select {
			case code = <-done:
				exited = true
				return true
			default:
				return strings.Contains(errb.String(), "telemetryd started")
			}
		}, "log: %s", errb)
		require.False(t, exited, "exited with %d: %s", code, errb)
		cancel()
		assert.Equal(t, 0, <-done)
	})
	t.Run("with an auth file", func(t *testing.T) {
		f := newAuthFixture(t, nil, "ops:admin")
		c := DefaultConfig()
		require.NoError(t, c.parseFlags("telemetryd", []string{"-http-addr", ":8080", "-auth-file", f.path}, envMap(nil), &bytes.Buffer{}))
	})
}

// lockedBuffer is a goroutine-safe bytes.Buffer.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newAuthService runs a service with an auth file of devices dev-1,
// dev-2, sim-1 and tokens for every scope.
func newAuthService(t *testing.T, edit ...func(*Config)) (*Main, *authFixture) {
	t.Helper()
	f := newAuthFixture(t, []string{"dev-1", "dev-2", "sim-1"},
		"all:read", "sim:read:sim-*", "admin:admin", "metrics:metrics", "writer:write")
	cfg := newTestConfig(t)
	cfg.Security.AuthFile = f.path
	for _, e := range edit {
		e(&cfg)
	}
	return openTestService(t, cfg), f
}

// latestCount is how many readings GET latest returns for dev.
func latestCount(t *testing.T, base, dev, token string) int {
	t.Helper()
	code, body := httpDo(t, nil, http.MethodGet, base+"/v1/devices/"+dev+"/readings/latest?limit=1000", token)
	require.Equal(t, http.StatusOK, code, body)
	var l apiList
	require.NoError(t, json.Unmarshal([]byte(body), &l))
	return len(l.Readings)
}

// deniedCount reads telemetry_auth_denied_total{reason} from /metrics.
func deniedCount(t *testing.T, base, token, reason string) int {
	t.Helper()
	code, body := httpDo(t, nil, http.MethodGet, base+"/metrics", token)
	require.Equal(t, http.StatusOK, code, body)
	m := regexp.MustCompile(`(?m)^telemetry_auth_denied_total\{[^}]*reason="` + reason + `"[^}]*\} (\d+)`).FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func TestNATSDeviceAuth(t *testing.T) {
	inLane(t, lanes.general)
	m, f := newAuthService(t)
	base := "http://" + m.HTTPAddr()
	url := m.NATSURL()
	now := m.now().UTC()

	t.Run("wrong secret, no secret, unknown device", func(t *testing.T) {
		for _, c := range []struct{ user, pass string }{{"dev-1", f.devices["dev-2"]}, {"dev-1", ""}, {"", ""}, {"dev-9", f.devices["dev-1"]}, {natsembed.InternalUser, f.devices["dev-1"]}} {
			_, _, err := deviceConn(url, c.user, c.pass, nats.MaxReconnects(0))
			require.Error(t, err, "user %q", c.user)
			assert.Contains(t, strings.ToLower(err.Error()), "authorization violation")
		}
		assert.GreaterOrEqual(t, deniedCount(t, base, f.tokens["metrics"], natsembed.DeniedCredentials), 5)
	})

	nc1, errs1, err := deviceConn(url, "dev-1", f.devices["dev-1"])
	require.NoError(t, err, "right secret")
	defer nc1.Close()
	js1, err := jetstream.New(nc1)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err = js1.Publish(ctx, "telemetry.dev-1", fmt.Appendf(nil, `{"ts":%q,"temp":1}`, now.Format(time.RFC3339Nano)))
	require.NoError(t, err, "a device publishes its own readings")
	waitFor(t, 20*time.Millisecond, func() bool { return latestCount(t, base, "dev-1", f.tokens["all"]) == 1 })

	t.Run("publish as another device stores nothing and is counted", func(t *testing.T) {
		before := deniedCount(t, base, f.tokens["metrics"], natsembed.DeniedPublish)
		require.NoError(t, nc1.Publish("telemetry.dev-2", fmt.Appendf(nil, `{"ts":%q,"temp":66}`, now.Format(time.RFC3339Nano))))
		require.NoError(t, nc1.Flush())
		waitAsyncError(t, errs1, `Permissions Violation for Publish to "`+storedSubject("dev-2")+`"`) // the subject the server mapped it to
		short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
		defer cancelShort()
		_, err := js1.Publish(short, "telemetry.dev-2", []byte(`{"temp":67}`), jetstream.WithRetryAttempts(0))
		require.Error(t, err, "no ack for a denied publish")
		waitFor(t, 20*time.Millisecond, func() bool { return deniedCount(t, base, f.tokens["metrics"], natsembed.DeniedPublish) >= before+2 })
		assert.Equal(t, 0, latestCount(t, base, "dev-2", f.tokens["all"]), "nothing stored for dev-2")
		short2, cancelShort2 := context.WithTimeout(ctx, 2*time.Second)
		defer cancelShort2()
		_, err = js1.Publish(short2, "rejected.telemetry.dev-1", []byte(`{}`), jetstream.WithRetryAttempts(0))
		require.Error(t, err, "nor to the dead letters")
	})

	t.Run("device cannot manage streams or consumers", func(t *testing.T) {
		// Each call gets its own deadline: a denied request is never
		// answered, an allowed one would be at once.
		short := func() context.Context {
			c, cancel := context.WithTimeout(t.Context(), 700*time.Millisecond)
			t.Cleanup(cancel)
			return c
		}
		_, err := js1.Stream(short(), "TELEMETRY_0")
		assert.Error(t, err, "stream info")
		names := js1.StreamNames(short())
		for range names.Name() {
		}
		assert.Error(t, names.Err(), "list streams")
		assert.Error(t, js1.DeleteStream(short(), "TELEMETRY_0"), "delete stream")
		_, err = js1.CreateOrUpdateConsumer(short(), "TELEMETRY_0", jetstream.ConsumerConfig{Durable: "evil"})
		assert.Error(t, err, "create consumer")
		assert.Error(t, js1.DeleteConsumer(short(), "TELEMETRY_0", "ingest"), "delete the ingest consumer")
		_, err = js1.CreateStream(short(), jetstream.StreamConfig{Name: "EVIL", Subjects: []string{"evil.>"}})
		assert.Error(t, err, "create stream")
		_, err = nc1.Request("$JS.API.STREAM.DELETE.TELEMETRY_0", nil, 700*time.Millisecond)
		assert.Error(t, err, "raw stream delete request")
		_, err = nc1.SubscribeSync(natsembed.ServiceInboxPrefix + ".>")
		require.NoError(t, err)
		require.NoError(t, nc1.Flush())
		waitAsyncError(t, errs1, "Permissions Violation for Subscription")
		// The service still ingests: the stream and consumer are intact.
		_, err = js1.Publish(ctx, "telemetry.dev-1", fmt.Appendf(nil, `{"ts":%q,"temp":2}`, now.Add(time.Second).Format(time.RFC3339Nano)))
		require.NoError(t, err)
		waitFor(t, 20*time.Millisecond, func() bool { return latestCount(t, base, "dev-1", f.tokens["all"]) == 2 })
	})

	t.Run("a device removed from the file is refused after reload; others stay", func(t *testing.T) {
		nc2, _, err := deviceConn(url, "dev-2", f.devices["dev-2"])
		require.NoError(t, err)
		defer nc2.Close()
		authCLI(t, f.path, "revoke", "dev-2")
		require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
		waitFor(t, 20*time.Millisecond, func() bool { return !nc2.IsConnected() },
			"the removed device is disconnected")
		_, _, err = deviceConn(url, "dev-2", f.devices["dev-2"], nats.MaxReconnects(0))
		require.Error(t, err, "and refused at its next connect")
		assert.True(t, nc1.IsConnected(), "dev-1 stays connected")
		_, err = js1.Publish(ctx, "telemetry.dev-1", fmt.Appendf(nil, `{"ts":%q,"temp":3}`, now.Add(2*time.Second).Format(time.RFC3339Nano)))
		require.NoError(t, err, "and keeps publishing")
		waitFor(t, 20*time.Millisecond, func() bool { return latestCount(t, base, "dev-1", f.tokens["all"]) == 3 })
	})
}

func TestHTTPAuthService(t *testing.T) {
	m, f := newAuthService(t)
	base := "http://" + m.HTTPAddr()
	nc, _, err := deviceConn(m.NATSURL(), "dev-1", f.devices["dev-1"])
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.Publish(t.Context(), "telemetry.dev-1", fmt.Appendf(nil, `{"ts":%q,"temp":1}`, m.now().UTC().Format(time.RFC3339Nano)))
	require.NoError(t, err)
	waitFor(t, 20*time.Millisecond, func() bool { return latestCount(t, base, "dev-1", f.tokens["all"]) == 1 })

	code, _ := httpDo(t, nil, http.MethodGet, base+"/v1/devices/dev-1/readings/latest", "")
	assert.Equal(t, http.StatusUnauthorized, code, "no token")
	code, _ = httpDo(t, nil, http.MethodGet, base+"/v1/devices/dev-1/readings/latest", f.tokens["sim"])
	assert.Equal(t, http.StatusNotFound, code, "a sim-* token cannot see dev-1")
	code, body := httpDo(t, nil, http.MethodGet, base+"/v1/devices", f.tokens["sim"])
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, body, "dev-1")
	code, body = httpDo(t, nil, http.MethodGet, base+"/v1/devices", f.tokens["all"])
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"dev-1"`)
	code, _ = httpDo(t, nil, http.MethodPost, base+"/v1/retention/run?dry_run=true", "")
	assert.Equal(t, http.StatusUnauthorized, code, "admin from loopback without a token")
	code, _ = httpDo(t, nil, http.MethodPost, base+"/v1/retention/run?dry_run=true", f.tokens["all"])
	assert.Equal(t, http.StatusForbidden, code, "read token on an admin endpoint")
	code, _ = httpDo(t, nil, http.MethodPost, base+"/v1/retention/run?dry_run=true", f.tokens["admin"])
	assert.Equal(t, http.StatusOK, code)
	code, _ = httpDo(t, nil, http.MethodGet, base+"/healthz", "")
	assert.Equal(t, http.StatusOK, code)
	code, _ = httpDo(t, nil, http.MethodGet, base+"/metrics", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = httpDo(t, nil, http.MethodGet, base+"/metrics", f.tokens["all"])
	assert.Equal(t, http.StatusForbidden, code)
	code, _ = httpDo(t, nil, http.MethodGet, base+"/metrics", f.tokens["metrics"])
	assert.Equal(t, http.StatusOK, code)

	t.Run("a token added to the file works after the poll", func(t *testing.T) {
		secret := authCLI(t, f.path, "add-token", "late", "-scopes", "read")
		waitFor(t, 100*time.Millisecond, func() bool {
			code, _ := httpDo(t, nil, http.MethodGet, base+"/v1/tables", secret)
			return code == http.StatusOK
		})
	})
}

// waitAsyncError waits for an async error containing want.
func waitAsyncError(t *testing.T, errs chan error, want string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-errs:
			if strings.Contains(err.Error(), want) {
				return
			}
		case <-timeout:
			t.Fatalf("no async error %q", want)
		}
	}
}

func TestNATSGatewayPublishAs(t *testing.T) {
	f := newAuthFixture(t, nil, "all:read")
	gw := authCLI(t, f.path, "add-device", "gw-1", "-publish-as", "sim-1,sim-2")
	cfg := newTestConfig(t)
	cfg.Security.AuthFile = f.path
	m := openTestService(t, cfg)
	base := "http://" + m.HTTPAddr()
	nc, errs, err := deviceConn(m.NATSURL(), "gw-1", gw)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ts := m.now().UTC().Format(time.RFC3339Nano)
	for _, dev := range []string{"gw-1", "sim-1", "sim-2"} {
		_, err := js.Publish(t.Context(), "telemetry."+dev, fmt.Appendf(nil, `{"ts":%q,"v":1}`, ts))
		require.NoError(t, err, dev)
	}
	require.NoError(t, nc.Publish("telemetry.dev-1", fmt.Appendf(nil, `{"ts":%q,"v":1}`, ts)))
	waitAsyncError(t, errs, `Permissions Violation for Publish to "`+storedSubject("dev-1")+`"`) // the subject the server mapped it to
	for _, dev := range []string{"gw-1", "sim-1", "sim-2"} {
		waitFor(t, 20*time.Millisecond, func() bool { return latestCount(t, base, dev, f.tokens["all"]) == 1 }, dev)
	}
	assert.Equal(t, 0, latestCount(t, base, "dev-1", f.tokens["all"]))
	assert.Contains(t, authCLI(t, f.path, "list"), "gw-1,sim-1,sim-2")
}

func TestWriteAndDashboardAuth(t *testing.T) {
	m, f := newAuthService(t)
	base := "http://" + m.HTTPAddr()
	ts := m.now().UnixNano()
	write := func(path, authz, body string) int {
		req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		require.NoError(t, err)
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	line := func(dev string, i int) string {
		return fmt.Sprintf("env,device=%s temp=%d %d", dev, i, ts+int64(i)*int64(time.Millisecond))
	}
	assert.Equal(t, http.StatusUnauthorized, write("/api/v2/write?bucket=b", "", line("dev-1", 1)), "no token")
	assert.Equal(t, http.StatusForbidden, write("/api/v2/write?bucket=b", "Token "+f.tokens["all"], line("dev-1", 1)), "read token")
	assert.Equal(t, http.StatusNoContent, write("/api/v2/write?bucket=b", "Token "+f.tokens["writer"], line("dev-1", 1)), "Influx v2 Token")
	assert.Equal(t, http.StatusNoContent, write("/write?db=d", basic("telegraf", f.tokens["writer"]), line("dev-1", 2)), "Basic, token as password")
	assert.Equal(t, http.StatusNoContent, write("/api/v2/write?bucket=b", "Bearer "+f.tokens["writer"], line("sim-1", 3)), "Bearer")
	assert.Equal(t, http.StatusUnauthorized, write("/write?db=d", basic("telegraf", "wrong-secret-0123456789"), line("dev-1", 4)))
	waitFor(t, 20*time.Millisecond, func() bool {
		return latestCount(t, base, "dev-1", f.tokens["all"]) == 2 && latestCount(t, base, "sim-1", f.tokens["all"]) == 1
	})

	get := func(path, token string) (int, string) { return httpDo(t, nil, http.MethodGet, base+path, token) }
	code, body := get("/api/v1/label/device/values", f.tokens["all"])
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"dev-1"`)
	code, body = get("/api/v1/label/device/values", f.tokens["sim"])
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, "dev-1", "a sim-* token does not see dev-1 in label values")
	assert.Contains(t, body, `"sim-1"`)
	code, body = get("/api/v1/series?match[]="+url.QueryEscape(`env_temp`), f.tokens["sim"])
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, "dev-1", "nor in series")
	assert.Contains(t, body, `"sim-1"`)
	code, body = get("/api/v1/query?query="+url.QueryEscape(`env_temp`), f.tokens["sim"])
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, "dev-1", "nor in query results")
	assert.Contains(t, body, `"sim-1"`)
	code, _ = get("/v1/devices/dev-1/aggregates?interval=1h", f.tokens["sim"])
	assert.Equal(t, http.StatusNotFound, code, "nor its aggregates")
	code, _ = get("/v1/devices/sim-1/aggregates?interval=1h", f.tokens["sim"])
	assert.Equal(t, http.StatusOK, code)
	code, _ = get("/api/v1/labels", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	// The page and its files load without a token (its sign-in form
	// asks for one); the data it shows does not.
	for _, p := range []string{"/", "/ui/", "/ui/app.js", "/ui/style.css", "/ui/uPlot.iife.min.js"} {
		code, _ = get(p, "")
		assert.Equal(t, http.StatusOK, code, p)
	}
	code, _ = get("/v1/devices", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = get("/api/v1/metadata", "")
	assert.Equal(t, http.StatusUnauthorized, code)
}
