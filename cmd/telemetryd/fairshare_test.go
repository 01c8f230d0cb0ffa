package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// deniedBomb is a gzip body of about 1 MB that inflates to at most
// size bytes of lines for a device the sim-* tokens may not write.
func deniedBomb(t *testing.T, size int) []byte {
	t.Helper()
	var b bytes.Buffer
	for i := 0; ; i++ {
		mod := 1000 + 1000*(1-i%2) // values just varied enough for 16:1
		line := fmt.Appendf(nil, "m,device=other v=%d\n", (i*7919)%mod)
		if b.Len()+len(line) > size {
			break
		}
		b.Write(line)
	}
	return gz(t, b.Bytes())
}

// writeReq sends body to /api/v2/write with token; body may be a
// reader that never ends (then size is its Content-Length).
func writeReq(ctx context.Context, base, token string, body io.Reader, size int64, gzipped bool) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v2/write?bucket=b", body)
	if err != nil {
		return nil, nil, err
	}
	req.ContentLength = size
	req.Header.Set("Authorization", "Token "+token)
	if gzipped {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// Write bodies in flight are paid for from the write share of
// -memory-limit: while two writes whose bodies are still arriving hold
// most of it, a gzip body that inflates past what is left is refused
// with 503 and Retry-After as it inflates, and a write whose
// Content-Length does not fit is refused before its body is read. Once
// the holders are gone, the same gzip body is answered (403: the token
// may not write its lines).
func TestWriteBodiesWithinTheMemoryBudget(t *testing.T) {
	inLane(t, lanes.general)
	f := newAuthFixture(t, nil, "sim:write:sim-*")
	cfg := newTestConfig(t)
	cfg.Security.AuthFile = f.path
	cfg.MemoryLimit = 256 << 20 // the write share is its floor: two 16 MiB bodies and a chunk
	m := openTestService(t, cfg)
	base := "http://" + m.HTTPAddr()
	tok := f.tokens["sim"]

	// Two holders: bodies of 16 MiB whose bytes never come.
	var holders sync.WaitGroup
	var pipes []*io.PipeWriter
	for range 2 {
		pr, pw := io.Pipe()
		pipes = append(pipes, pw)
		holders.Go(func() { _, _, _ = writeReq(context.Background(), base, tok, pr, 16<<20, false) })
	}
	defer func() {
		for _, pw := range pipes {
			pw.CloseWithError(errors.New("test over"))
		}
		holders.Wait()
	}()

	bomb := deniedBomb(t, 16<<20)
	require.Less(t, len(bomb), 1<<20)
	var resp *http.Response
	var body []byte
	waitFor(t, 50*time.Millisecond, func() bool {
		var err error
		resp, body, err = writeReq(context.Background(), base, tok, bytes.NewReader(bomb), int64(len(bomb)), true)
		require.NoError(t, err)
		return resp.StatusCode == http.StatusServiceUnavailable
	}, "the gzip body was never refused: last %d %s", statusOf(resp), body)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	code, msg := influxBody(t, string(body))
	assert.Equal(t, "unavailable", code)
	assert.Contains(t, msg, "memory budget for write bodies in flight is spent")

	// Refused before its body is read: the body never comes, yet the
	// answer does.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	resp, body, err := writeReq(ctx, base, tok, pr, 16<<20, false)
	require.NoError(t, err, "a write that cannot fit must be answered without its body")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))

	for _, pw := range pipes {
		pw.CloseWithError(errors.New("holder gone"))
	}
	holders.Wait()
	waitFor(t, 50*time.Millisecond, func() bool {
		resp, body, err = writeReq(context.Background(), base, tok, bytes.NewReader(bomb), int64(len(bomb)), true)
		require.NoError(t, err)
		return resp.StatusCode == http.StatusForbidden
	}, "the budget was not given back: last %d %s", statusOf(resp), body)
	assert.Contains(t, string(body), "device_not_allowed")
}

func statusOf(r *http.Response) int {
	if r == nil {
		return 0
	}
	return r.StatusCode
}

// A body larger than one mapping chunk is mapped in chunks: rejected
// lines past the first chunk are named by their line in the body, in
// the answer and in their dead letter, and every good line is stored.
func TestLineProtocolLargeBodyMappedInChunks(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	dl := deadLetters(t, s)
	at := testEpoch.Add(-time.Hour).Truncate(time.Second)
	var b bytes.Buffer
	const good = 20000 // about 600 KiB: three chunks
	for i := range good {
		fmt.Fprintf(&b, "env,device=chunky-%d v=%d %d\n", i%7, i, at.Add(time.Duration(i)*time.Millisecond).UnixNano())
	}
	b.WriteString("env,device=chunky-0 v=\n")
	code, resp := s.post(t, "/api/v2/write", b.Bytes(), nil)
	require.Equal(t, http.StatusBadRequest, code, resp)
	_, msg := influxBody(t, resp)
	assert.Contains(t, msg, fmt.Sprintf("partial write: 1 of %d lines rejected; line %d: ", good+1, good+1))
	letter, err := dl.NextMsg(10 * time.Second)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(letter.Header.Get("Telemetry-Error"), fmt.Sprintf("line %d: ", good+1)), letter.Header.Get("Telemetry-Error"))
	waitFor(t, 100*time.Millisecond, func() bool {
		var n int
		for d := range 7 {
			var l apiList
			code, _ := s.get(t, fmt.Sprintf("/v1/devices/chunky-%d/readings?from=%d&limit=10000", d, at.UnixMilli()), &l)
			if code != http.StatusOK {
				return false
			}
			n += len(l.Readings)
		}
		return n == good
	})
}

// heavyQuery is a PromQL range query that keeps the engine busy for
// seconds over no stored data at all (its subquery has the most points
// per step allowed but one).
func heavyQuery(base string) string {
	end := time.Now()
	q := url.Values{"query": {"quantile_over_time(0.5, vector(1)[3h:1s])"},
		"start": {fmt.Sprint(end.Add(-time.Hour).Unix())}, "end": {fmt.Sprint(end.Unix())}, "step": {"1"}}
	return base + "/api/v1/query_range?" + q.Encode()
}

// One token's heavy queries cannot turn other clients away: while
// eight workers of a token that sees one device send heavy PromQL
// queries back to back, the token holds at most its share (a quarter
// of the response budget: two PromQL queries) and its other queries are
// answered 429 resource_exhausted with Retry-After, while another
// token's latest-10 reads are never refused.
func TestOneTokensHeavyQueriesLeaveOthersServed(t *testing.T) {
	f := newAuthFixture(t, nil, "heavy:read:hv-*", "other:read", "writer:write")
	cfg := newTestConfig(t)
	cfg.Security.AuthFile = f.path
	cfg.Security.HTTPRate, cfg.Security.HTTPBurst = 1e6, 1e6 // not under test
	m := openTestService(t, cfg)
	base := "http://" + m.HTTPAddr()
	at := testEpoch.Add(-time.Minute).UnixNano()
	code, body := httpPost(t, base+"/api/v2/write", f.tokens["writer"],
		fmt.Sprintf("m,device=hv-1 v=1 %d\nm,device=dev-o v=2 %d\n", at, at))
	require.Equal(t, http.StatusNoContent, code, body)
	waitFor(t, 20*time.Millisecond, func() bool { return latestCount(t, base, "dev-o", f.tokens["other"]) == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	var (
		mu       sync.Mutex
		heavy    = map[int]int{}
		retry    []string
		heavyErr []string
	)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, heavyQuery(base), nil)
				req.Header.Set("Authorization", "Bearer "+f.tokens["heavy"])
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					continue // the test's end cancels the request
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				mu.Lock()
				heavy[resp.StatusCode]++
				if strings.Contains(string(b), "memory budget for responses in flight is spent") {
					heavy[0]++ // the whole budget, not the token's share
				}
				if resp.StatusCode == http.StatusTooManyRequests {
					retry = append(retry, resp.Header.Get("Retry-After"))
					if !strings.Contains(string(b), "share") {
						heavyErr = append(heavyErr, string(b))
					}
				}
				mu.Unlock()
				if resp.StatusCode == http.StatusTooManyRequests {
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	var lat []time.Duration
	others := map[int]int{}
	for ctx.Err() == nil {
		start := time.Now()
		code, body := httpDo(t, nil, http.MethodGet, base+"/v1/devices/dev-o/readings/latest?limit=10", f.tokens["other"])
		lat = append(lat, time.Since(start))
		others[code]++
		assert.NotEqual(t, http.StatusServiceUnavailable, code, body)
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	slices.Sort(lat)
	within := 0
	for _, d := range lat {
		if d <= time.Second {
			within++
		}
	}
	t.Logf("other client: %d reads %v, %.1f%% within 1 s, p50 %v p95 %v max %v; heavy token: %v",
		len(lat), others, 100*float64(within)/float64(len(lat)), lat[len(lat)/2], lat[len(lat)*95/100], lat[len(lat)-1], heavy)
	assert.Equal(t, len(lat), others[http.StatusOK], "every read of the other client answered 200")
	assert.Positive(t, heavy[http.StatusTooManyRequests], "the heavy token was held to its share")
	assert.Zero(t, heavy[0], "the heavy token never spent the whole budget")
	assert.Empty(t, heavyErr, "a 429 of the share names it")
	for _, r := range retry {
		assert.Equal(t, "1", r)
	}
}

// httpPost posts a body with a bearer token.
func httpPost(t *testing.T, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestWriteAttackWithinMemoryLimit runs the real binary with
// -memory-limit 512MiB and sends it 48 writes at once, each a 1 MB gzip
// body inflating to 16 MiB of lines the token may not write. Every
// request must be answered (403, or 503 with Retry-After) and the peak
// RSS (VmHWM) must stay within the limit. It builds the binary, so it
// only runs with TELEMETRY_MEMTEST=1:
//
//	TELEMETRY_MEMTEST=1 go test ./cmd/telemetryd -run TestWriteAttackWithinMemoryLimit -v
func TestWriteAttackWithinMemoryLimit(t *testing.T) {
	if os.Getenv("TELEMETRY_MEMTEST") != "1" {
		t.Skip("set TELEMETRY_MEMTEST=1 to run the memory measurement")
	}
	dir := t.TempDir()
	f := newAuthFixture(t, nil, "sim:write:sim-*")
	bin := filepath.Join(dir, "telemetryd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	httpAddr, natsAddr := freeLoopback(t), freeLoopback(t)
	cmd := exec.Command(bin, "-data-dir", filepath.Join(dir, "data"), "-http-addr", httpAddr, "-nats-listen", natsAddr,
		"-mqtt-listen", "", "-log-level", "warn", "-memory-limit", "512MiB", "-auth-file", f.path)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	base := "http://" + httpAddr
	waitReadyz(t, base)
	t.Logf("after start: RSS %d MiB", procStatus(t, cmd.Process.Pid, "VmRSS")>>10)

	bomb := deniedBomb(t, 16<<20)
	const n = 48
	codes := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			resp, _, err := writeReq(context.Background(), base, f.tokens["sim"], bytes.NewReader(bomb), int64(len(bomb)), true)
			errs[i] = err
			if err == nil {
				codes[i] = resp.StatusCode
				if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
					errs[i] = errors.New("503 without Retry-After")
				}
			}
		})
	}
	wg.Wait()
	byCode := map[int]int{}
	for i := range n {
		assert.NoError(t, errs[i], "request %d", i)
		byCode[codes[i]]++
	}
	peak := procStatus(t, cmd.Process.Pid, "VmHWM")
	t.Logf("%d writes of %d KB gzip (16 MiB inflated) in %v: %v; peak RSS (VmHWM) %d MiB",
		n, len(bomb)>>10, time.Since(start).Round(time.Millisecond), byCode, peak>>10)
	assert.Equal(t, n, byCode[http.StatusForbidden]+byCode[http.StatusServiceUnavailable], "every write answered 403 or 503")
	assert.LessOrEqual(t, peak, int64(512<<10), "peak RSS within -memory-limit (KiB)")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait())
}

// promGet sends a PromQL request (form values q) and decodes the
// Prometheus envelope.
func promGet(t *testing.T, ctx context.Context, base, path string, q url.Values) (int, string, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(q.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	var e struct{ ErrorType, Error string }
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &e)
	return resp.StatusCode, e.ErrorType, e.Error, nil
}

// PromQL work that would ignore the timeout is refused before it
// starts: nesting past 256 levels without calling the parser, and a
// subquery of more than 11,000 points per step.
func TestPromQLRefusesUnboundedWork(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	for _, depth := range []int{257, 100_000} {
		qs := strings.Repeat("(", depth) + "1" + strings.Repeat(")", depth)
		code, typ, msg, err := promGet(t, context.Background(), s.base, "/api/v1/query", url.Values{"query": {qs}})
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadRequest, code, msg)
		assert.Equal(t, "bad_data", typ)
		assert.Contains(t, msg, "nested deeper than 256 levels", "depth %d", depth)
	}
	qs := strings.Repeat("(", 256) + "1" + strings.Repeat(")", 256)
	code, _, msg, err := promGet(t, context.Background(), s.base, "/api/v1/query", url.Values{"query": {qs}})
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "256 levels are allowed: %s", msg)

	end := time.Now()
	q := url.Values{"query": {"quantile_over_time(0.5, vector(1)[6h:1s])"},
		"start": {fmt.Sprint(end.Add(-time.Hour).Unix())}, "end": {fmt.Sprint(end.Unix())}, "step": {"60"}}
	code, typ, msg, err := promGet(t, context.Background(), s.base, "/api/v1/query_range", q)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, code, msg)
	assert.Equal(t, "bad_data", typ)
	assert.Contains(t, msg, "21600 points per step, more than 11000")
	q.Set("query", "quantile_over_time(0.5, vector(1)[11000s:1s])")
	code, _, msg, err = promGet(t, context.Background(), s.base, "/api/v1/query_range", q)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "11,000 points per step are allowed: %s", msg)
}

// A PromQL query in a long subquery is answered at its -query-timeout,
// and its client's share comes back once the engine stops (it looks at
// the deadline at every step, api/promapi TestQueryStopsAtItsContext;
// until it stops the query keeps the share, so a client cannot pile up
// work past its deadline).
func TestPromQLAnswersAtTheQueryTimeout(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.QueryTimeout = 300 * time.Millisecond
	s := startService(t, cfg)
	end := time.Now()
	heavy := url.Values{"query": {"quantile_over_time(0.5, vector(1)[3h:1s])"},
		"start": {fmt.Sprint(end.Add(-6 * time.Hour).Unix())}, "end": {fmt.Sprint(end.Unix())}, "step": {"2"}}

	var wg sync.WaitGroup
	answered := make(chan time.Time, 2)
	for range 2 { // the client's share: two PromQL queries
		wg.Go(func() {
			code, typ, msg, err := promGet(t, context.Background(), s.base, "/api/v1/query_range", heavy)
			answered <- time.Now()
			assert.NoError(t, err)
			assert.Equal(t, http.StatusServiceUnavailable, code, msg)
			assert.Equal(t, "timeout", typ)
		})
	}
	<-answered
	<-answered
	wg.Wait()
	waitFor(t, 50*time.Millisecond, func() bool {
		code, _, _, err := promGet(t, context.Background(), s.base, "/api/v1/query", url.Values{"query": {"1"}})
		return err == nil && code == http.StatusOK
	}, "the share came back once the engine stopped")
}

// An aggregates query over a device with 250 value names is bounded:
// its pages hold only as many buckets as the client's share of the
// response budget holds at 128 bytes a value (the rest follow the
// cursor), and the store stops summarising blocks once the request's
// context ends (its client went away or its timeout passed).
func TestWideAggregatesStayWithinTheirShareAndStop(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.MemoryLimit = 256 << 20 // responses: 25.6 MiB, a client's share 6.4 MiB
	s := startService(t, cfg)
	end := testEpoch.Add(-time.Minute).Truncate(time.Hour)
	const n, names = 1440, 250
	var b bytes.Buffer
	for i := range n {
		b.WriteString("m,device=wide ")
		for v := range names {
			if v > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "v%d=%d", v, (i+v)%97)
		}
		fmt.Fprintf(&b, " %d\n", end.Add(-time.Duration(n-i)*time.Minute).UnixNano())
	}
	code, body := s.post(t, "/api/v2/write", b.Bytes(), nil)
	require.Equal(t, http.StatusNoContent, code, body)
	from := end.Add(-time.Duration(n) * time.Minute)
	waitFor(t, 100*time.Millisecond, func() bool {
		var l apiList
		code, _ := s.get(t, fmt.Sprintf("/v1/devices/wide/readings?from=%d&limit=10000", from.UnixMilli()), &l)
		return code == http.StatusOK && len(l.Readings) == n
	})

	perPage := int(s.budget.Queries / 4 / (names * 128))
	q := url.Values{"from": {from.Format(time.RFC3339)}, "to": {end.Format(time.RFC3339)}, "interval": {"1m"}}
	total := 0
	for page := 0; ; page++ {
		var a struct {
			Buckets []struct {
				Values map[string]any `json:"values"`
			} `json:"buckets"`
			Next string `json:"next"`
		}
		code, body := s.get(t, "/v1/devices/wide/aggregates?"+q.Encode(), &a)
		require.Equal(t, http.StatusOK, code, body)
		require.LessOrEqual(t, len(a.Buckets), perPage, "page %d holds more than the share", page)
		for _, bk := range a.Buckets {
			require.Len(t, bk.Values, names)
		}
		total += len(a.Buckets)
		if a.Next == "" {
			break
		}
		q.Set("cursor", a.Next)
	}
	assert.Equal(t, n, total, "every bucket, over the pages")

	// A context that ends while the store is summarising blocks.
	ctx := &endingContext{Context: context.Background(), left: 3}
	_, err := s.store.Aggregate(ctx, buckets.AggregateQuery{Device: "wide", From: buckets.MustTicks(from),
		To: buckets.MustTicks(end), Interval: 60 * buckets.TicksPerSecond, Limit: 10000})
	assert.ErrorIs(t, err, context.Canceled, "the store stops summarising once the request's context ends")
}

// endingContext reports itself canceled from its left+1-th Err call on:
// a client that goes away while its query runs.
type endingContext struct {
	context.Context
	mu   sync.Mutex
	left int
}

func (c *endingContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.left--; c.left < 0 {
		return context.Canceled
	}
	return nil
}
