package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// breakingProxy forwards requests to upstream and breaks the transfer
// of every response whose number is in broken after cut bytes, as a
// network failure would; the other responses pass whole, trailers too.
func breakingProxy(t *testing.T, upstream string, cut int64, broken ...int) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1))
		req, err := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), nil)
		if err != nil {
			panic(err)
		}
		req.Header = r.Header.Clone()
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		defer res.Body.Close()
		for k, v := range res.Header {
			w.Header()[k] = v
		}
		w.Header().Set("Trailer", "Export-Next")
		w.WriteHeader(res.StatusCode)
		for _, b := range broken {
			if b == i {
				_, _ = io.CopyN(w, res.Body, cut)
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			}
		}
		_, _ = io.Copy(w, res.Body)
		w.Header().Set("Export-Next", res.Trailer.Get("Export-Next"))
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// `telemetryd export` writes the same bytes from a stopped data dir and
// from the running service, in both formats, even when transfers break
// mid-way (each resumed behind the last reading written, with no
// duplicate and no gap); a service holding the data dir is named.
func TestExportCommand(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	day := buckets.DayOf(buckets.MustTicks(testEpoch)) - 1
	fillStore(t, cfg.DataDir, day, day, 6000, 7)
	dir := t.TempDir()
	export := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"export", "-log-level", "warn"}, args...), envMap(nil), &stdout, &stderr)
		require.Equal(t, 0, code, stderr.String())
		assert.Contains(t, stderr.String(), "telemetryd export: 6000 readings in ")
		return stderr.String()
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		return string(b)
	}
	to := testEpoch.Format("2006-01-02T15:04:05Z")
	export("-data-dir", cfg.DataDir, "-to", to, "-o", filepath.Join(dir, "offline.ndjson"))
	export("-data-dir", cfg.DataDir, "-to", to, "-format", "csv", "-o", filepath.Join(dir, "offline.csv"))
	lines := strings.Split(strings.TrimSuffix(read("offline.ndjson"), "\n"), "\n")
	require.Len(t, lines, 6000)
	assert.True(t, strings.HasPrefix(lines[0], `{"device":"dev-0000","ts":"`+day.String()+`T00:00:00Z"`), lines[0])
	assert.True(t, strings.HasPrefix(lines[5999], `{"device":"dev-0006","ts":"`), lines[5999])
	assert.Equal(t, 1+3*6000, strings.Count(read("offline.csv"), "\n"))
	// An export that matches nothing succeeds with its (empty) file.
	var eout, eerr bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"export", "-data-dir", cfg.DataDir, "-prefix", "none-", "-o", filepath.Join(dir, "empty.ndjson")},
		envMap(nil), &eout, &eerr), eerr.String())
	assert.Empty(t, read("empty.ndjson"))
	assert.Contains(t, eerr.String(), "telemetryd export: 0 readings in ")

	s := startService(t, cfg)
	// The export is the range API's answers, device by device.
	var fromRange []string
	for d := range 7 {
		dev := fmt.Sprintf("dev-%04d", d)
		cursor := ""
		for {
			var page struct {
				Readings []json.RawMessage `json:"readings"`
				Next     string            `json:"next"`
			}
			code, body := s.get(t, "/v1/devices/"+dev+"/readings?"+url.Values{"from": {"0"}, "to": {to},
				"order": {"asc"}, "limit": {"500"}, "cursor": {cursor}}.Encode(), &page)
			require.Equal(t, http.StatusOK, code, body)
			for _, r := range page.Readings {
				fromRange = append(fromRange, `{"device":"`+dev+`",`+string(r[1:]))
			}
			if cursor = page.Next; cursor == "" {
				break
			}
		}
	}
	assert.Equal(t, fromRange, lines)

	// An offline export of the running service's data dir refuses
	// before it writes anything: no output file, no count, one line
	// naming the fix.
	var stdout, stderr bytes.Buffer
	refused := filepath.Join(dir, "refused.ndjson")
	code := run(context.Background(), []string{"export", "-data-dir", cfg.DataDir, "-o", refused}, envMap(nil), &stdout, &stderr)
	assert.Equal(t, 1, code)
	assert.Equal(t, "telemetryd export: -data-dir "+cfg.DataDir+" is in use by a running telemetryd; export through it with -url http://<its -http-addr>\n",
		stderr.String())
	assert.NotContains(t, stderr.String(), "0 readings")
	assert.NoFileExists(t, refused, "a refused export leaves no file")
	assert.Empty(t, stdout.String())

	for _, format := range []string{"ndjson", "csv"} {
		t.Run(format, func(t *testing.T) {
			export("-url", s.base, "-to", to, "-format", format, "-o", filepath.Join(dir, "plain."+format))
			assert.Equal(t, read("offline."+format), read("plain."+format))

			// Pages of 1,000 readings; the 2nd and 4th transfers break
			// (the 4th in the middle of a resumed page).
			proxy, requests := breakingProxy(t, s.base, 40_000, 2, 4)
			log := export("-url", proxy.URL, "-to", to, "-format", format, "-page", "1000", "-o", filepath.Join(dir, "resumed."+format))
			assert.Equal(t, read("offline."+format), read("resumed."+format))
			assert.Equal(t, 2, strings.Count(log, "resuming"), log)
			assert.Equal(t, int32(6+2), requests.Load(), "6 pages and 2 resumed")
		})
	}
}

// The token comes from -token or TELEMETRY_TOKEN; a refusal is reported
// with the service's message and not retried.
func TestExportCommandToken(t *testing.T) {
	inLane(t, lanes.general)
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.Header.Get("Authorization") != "Bearer s3cret-token" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":{"code":"unauthenticated","message":"authorization: no token"}}`)
			return
		}
		assert.Equal(t, "/v1/export", r.URL.Path)
		assert.Equal(t, `{fleet="East"}`, r.URL.Query().Get("match"))
		_, _ = io.WriteString(w, `{"device":"d1","ts":"2026-11-22T00:00:00Z","partitionKey":"d1/2026-11-22","rowKey":"2516069052799999999","values":{"v":1}}`+"\n")
	}))
	defer srv.Close()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"export", "-url", srv.URL, "-match", `{fleet="East"}`},
		envMap(map[string]string{"TELEMETRY_TOKEN": "s3cret-token"}), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	assert.Equal(t, 1, strings.Count(stdout.String(), "\n"))
	assert.Contains(t, stderr.String(), "telemetryd export: 1 readings in ")

	requests.Store(0)
	stdout.Reset()
	stderr.Reset()
	code = run(context.Background(), []string{"export", "-url", srv.URL}, envMap(nil), &stdout, &stderr)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "401 Unauthorized: {\"error\":{\"code\":\"unauthenticated\",\"message\":\"authorization: no token\"}}")
	assert.Equal(t, int32(1), requests.Load(), "not retried")
	assert.Empty(t, stdout.String())

	// Refused with -o: no file is left and no count is printed.
	stderr.Reset()
	refused := filepath.Join(t.TempDir(), "refused.ndjson")
	code = run(context.Background(), []string{"export", "-url", srv.URL, "-o", refused}, envMap(nil), &stdout, &stderr)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "401 Unauthorized")
	assert.NotContains(t, stderr.String(), "0 readings")
	assert.NoFileExists(t, refused, "a refused export leaves no file")
}
