package main

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/cmd/internal/authcli"
)

// authCLI runs `telemetryd auth args...` and returns stdout.
func authCLI(t *testing.T, file string, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	code := authcli.Run(append(args, "-auth-file", file), func(string) string { return "" }, &out, &errb)
	require.Equal(t, 0, code, "telemetryd auth %v: %s", args, errb.String())
	return strings.TrimSpace(out.String())
}

// authFixture is an auth file with known secrets.
type authFixture struct {
	path    string
	devices map[string]string // id -> secret
	tokens  map[string]string // name -> secret
}

// newAuthFixture creates an auth file (through the CLI) with devices
// and tokens "name:scopes[:patterns]".
func newAuthFixture(t *testing.T, devices []string, tokens ...string) *authFixture {
	t.Helper()
	f := &authFixture{path: filepath.Join(t.TempDir(), "auth.json"), devices: map[string]string{}, tokens: map[string]string{}}
	for _, d := range devices {
		f.devices[d] = authCLI(t, f.path, "add-device", d)
	}
	for _, spec := range tokens {
		parts := strings.Split(spec, ":")
		args := []string{"add-token", parts[0], "-scopes", parts[1]}
		if len(parts) > 2 {
			args = append(args, "-devices", parts[2])
		}
		f.tokens[parts[0]] = authCLI(t, f.path, args...)
	}
	return f
}

// openTestService starts a service without connecting a client.
func openTestService(t *testing.T, cfg Config) *Main {
	t.Helper()
	m := openMain(t, cfg, testLogWriter(t), testClock())
	scheme, client := "http://", http.DefaultClient
	if cfg.Security.TLSCert != "" {
		scheme = "https://"
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	}
	waitFor(t, 20*time.Millisecond, func() bool {
		resp, err := client.Get(scheme + m.HTTPAddr() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "service never became ready")
	return m
}

// httpDo sends a request with an optional bearer token.
func httpDo(t *testing.T, client *http.Client, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// deviceConn connects to url as a device; errs receives async errors.
func deviceConn(url, id, secret string, extra ...nats.Option) (*nats.Conn, chan error, error) {
	errs := make(chan error, 64)
	opts := append([]nats.Option{nats.UserInfo(id, secret), nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		})}, extra...)
	nc, err := nats.Connect(url, opts...)
	return nc, errs, err
}
