package exportclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/exportclient"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// serve fills a Badger store with devices whose readings have several
// values each, a string with a line break and quotes among them (a CSV
// record over two lines), and serves it through the API.
func serve(t *testing.T) (*store.Store, string) {
	t.Helper()
	st, err := store.Open(context.Background(), t.TempDir(), store.DefaultOptions())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Close()) })
	start := buckets.MustTicks(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
	var rs []buckets.Reading
	for d := range 4 {
		for i := range 300 {
			rs = append(rs, buckets.Reading{Device: buckets.DeviceID(fmt.Sprintf("dev-%d", d)),
				Ticks: start + buckets.Ticks(i)*buckets.TicksPerDay/1000, Values: []buckets.Field{
					{Name: "note", Value: buckets.String([]string{"plain", "a,b", "say \"hi\"\nagain"}[i%3])},
					{Name: "temp", Value: buckets.Float(float64(i) / 4)},
				}})
		}
	}
	require.NoError(t, st.Write(context.Background(), rs))
	srv, err := api.New(api.Config{Addr: "127.0.0.1:0", Reader: st, Attributes: st,
		CursorKey: []byte("test cursor key")})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return st, hs.URL
}

// breaking forwards to upstream and cuts the body of every response
// whose number is in broken after cut bytes, as a network failure
// would; the other responses pass whole, trailers too.
func breaking(t *testing.T, upstream string, cut int64, broken ...int) (string, *atomic.Int32) {
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
	return srv.URL, &n
}

// The client pages the export and writes the bytes the offline export
// of the same store writes; transfers broken mid-record (the 2nd, and
// the 3rd, its resume, at the same byte) resume behind the last record
// written with no duplicate and no gap.
func TestExportResumesBehindTheLastRecord(t *testing.T) {
	st, base := serve(t)
	for _, format := range []string{api.FormatNDJSON, api.FormatCSV} {
		t.Run(format, func(t *testing.T) {
			var want bytes.Buffer
			n, err := api.Export(context.Background(), st, api.ExportOptions{Format: format}, &want, nil)
			require.NoError(t, err)
			require.Equal(t, int64(1200), n)

			var got bytes.Buffer
			c := &exportclient.Client{URL: base, Page: 500}
			n, err = c.Export(context.Background(), exportclient.Query{From: "0", Format: format}, &got, nil)
			require.NoError(t, err)
			assert.Equal(t, int64(1200), n)
			assert.Equal(t, want.String(), got.String())

			url, requests := breaking(t, base, 20_000+333, 2, 3)
			var resumes []int
			c = &exportclient.Client{URL: url, Page: 500, Backoff: time.Millisecond,
				OnResume: func(err error, attempt, retries int) { resumes = append(resumes, attempt) }}
			got.Reset()
			var progress int64
			n, err = c.Export(context.Background(), exportclient.Query{From: "0", Format: format}, &got,
				func(n int64) { progress = n })
			require.NoError(t, err)
			assert.Equal(t, int64(1200), n)
			assert.Equal(t, want.String(), got.String())
			assert.Equal(t, []int{1, 2}, resumes)
			assert.Equal(t, int32(3+2), requests.Load(), "3 pages and 2 resumed")
			assert.Equal(t, int64(1024), progress)
		})
	}
}

// A refusal is returned with the service's message and not retried;
// the token is sent as a bearer token.
func TestExportRefusalIsNotRetried(t *testing.T) {
	var requests atomic.Int32
	var auth atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		auth.Store(r.Header.Get("Authorization"))
		http.Error(w, `{"error":"forbidden"}`, http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	c := &exportclient.Client{URL: srv.URL, Token: "s3cret", Backoff: time.Millisecond}
	_, err := c.Export(context.Background(), exportclient.Query{}, io.Discard, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `403 Forbidden: {"error":"forbidden"}`)
	assert.Equal(t, int32(1), requests.Load())
	assert.Equal(t, "Bearer s3cret", auth.Load())
}

// A refusal for load is asked again Retries times in a row, then
// returned.
func TestExportGivesUpAfterRetries(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	var resumes int
	c := &exportclient.Client{URL: srv.URL, Retries: 3, Backoff: time.Millisecond,
		OnResume: func(error, int, int) { resumes++ }}
	_, err := c.Export(context.Background(), exportclient.Query{}, io.Discard, nil)
	require.ErrorContains(t, err, "503 Service Unavailable: busy")
	assert.Equal(t, int32(4), requests.Load())
	assert.Equal(t, 3, resumes)

	requests.Store(0)
	c = &exportclient.Client{URL: srv.URL, Retries: -1}
	_, err = c.Export(context.Background(), exportclient.Query{}, io.Discard, nil)
	require.ErrorContains(t, err, "503")
	assert.Equal(t, int32(1), requests.Load(), "negative Retries: never")
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// A failure to write the output ends the export at once: asking again
// would not help.
func TestExportOutputErrorIsNotRetried(t *testing.T) {
	_, base := serve(t)
	url, requests := breaking(t, base, 0)
	c := &exportclient.Client{URL: url, Backoff: time.Millisecond}
	_, err := c.Export(context.Background(), exportclient.Query{From: "0"}, failWriter{}, nil)
	require.ErrorContains(t, err, "write output: disk full")
	assert.Equal(t, int32(1), requests.Load())
}

func TestExportRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		c    exportclient.Client
		q    exportclient.Query
		want string
	}{
		{exportclient.Client{URL: "ftp://host"}, exportclient.Query{}, `URL "ftp://host" is not an http:// or https:// URL`},
		{exportclient.Client{URL: "http://"}, exportclient.Query{}, `URL "http://" is not an http:// or https:// URL`},
		{exportclient.Client{URL: "http://host"}, exportclient.Query{Format: "xml"}, `format "xml" is not ndjson or csv`},
		{exportclient.Client{URL: "http://host", Page: -1}, exportclient.Query{}, `page -1 is not positive`},
	} {
		_, err := tc.c.Export(context.Background(), tc.q, io.Discard, nil)
		assert.ErrorContains(t, err, tc.want)
	}
}

// A server error in the query is returned as the service words it.
func TestExportReportsTheServiceMessage(t *testing.T) {
	_, base := serve(t)
	c := &exportclient.Client{URL: base}
	_, err := c.Export(context.Background(), exportclient.Query{Match: "{fleet="}, io.Discard, nil)
	require.ErrorContains(t, err, "400 Bad Request")
	assert.True(t, strings.Contains(err.Error(), "match"), err.Error())
}
