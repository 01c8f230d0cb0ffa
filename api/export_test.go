package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// exportEnv fills a test server with devices whose readings have every
// kind of value, strings that need CSV quoting among them.
func exportEnv(t *testing.T, edit ...func(*api.Config)) *testEnv {
	t.Helper()
	env := newTestEnv(t, edit...)
	devs := []string{"dev-1", "dev-2", "sim-1", "sim-2", "sim-3"}
	for i, dev := range devs {
		n := 25 + 7*i
		rs := make([]buckets.Reading, n)
		for j := range rs {
			k := mustTicks(t, testNow.Add(-time.Duration(n-j)*time.Minute-time.Duration(j)*time.Microsecond).Format(time.RFC3339Nano))
			rs[j] = buckets.Reading{Device: buckets.DeviceID(dev), Ticks: k, Values: []buckets.Field{
				{Name: "i", Value: buckets.Int(int64(j - 10))},
				{Name: "note", Value: buckets.String([]string{"plain", "a,b", `say "hi"`, "two\nlines", " lead", ""}[j%6])},
				{Name: "ok", Value: buckets.Bool(j%2 == 0)},
				{Name: "temp", Value: buckets.Float(float64(j)*1.25 - 3)},
			}[:2+j%3]}
			if j%4 == 0 {
				rs[j].Values = append(rs[j].Values, buckets.Field{Name: "temp", Value: buckets.Float(1e-9 * float64(j))})
			}
		}
		env.reader.add(rs...)
		env.reader.devices = append(env.reader.devices, buckets.DeviceInfo{Device: buckets.DeviceID(dev)})
	}
	env.reader.setAttributes("sim-1", "fleet", "East")
	env.reader.setAttributes("sim-3", "fleet", "East")
	env.reader.setAttributes("dev-2", "fleet", "West")
	return env
}

// exportLine is one NDJSON line of an export.
type exportLine struct {
	Device       string         `json:"device"`
	TS           string         `json:"ts"`
	PartitionKey string         `json:"partitionKey"`
	RowKey       string         `json:"rowKey"`
	Values       map[string]any `json:"values"`
	Next         string         `json:"next"`
}

// rangeAnswers pages the range API over every listed device, oldest
// first, as export lines.
func rangeAnswers(t *testing.T, env *testEnv, devs []string, header ...string) []exportLine {
	t.Helper()
	var out []exportLine
	for _, dev := range devs {
		cursor := ""
		for {
			path := "/v1/devices/" + dev + "/readings" + q("from", "0", "to", testNow.Format(time.RFC3339), "order", "asc", "limit", "10", "cursor", cursor)
			r := env.do(t, http.MethodGet, path, header...)
			require.Equal(t, http.StatusOK, r.status, "%s", r.body)
			var list struct {
				Readings []exportLine `json:"readings"`
				Next     string       `json:"next"`
			}
			d := json.NewDecoder(bytes.NewReader(r.body))
			d.UseNumber()
			require.NoError(t, d.Decode(&list))
			for _, rd := range list.Readings {
				rd.Device = dev
				out = append(out, rd)
			}
			if list.Next == "" {
				break
			}
			cursor = list.Next
		}
	}
	return out
}

// parseNDJSON decodes an NDJSON export; next is its cursor line, if any.
func parseNDJSON(t *testing.T, body []byte) (lines []exportLine, next string) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		d.UseNumber()
		d.DisallowUnknownFields()
		var l exportLine
		require.NoError(t, d.Decode(&l), "line %q", sc.Text())
		if l.Next != "" {
			require.Empty(t, next, "one next line, the last")
			next = l.Next
			continue
		}
		require.Empty(t, next, "the next line is the last")
		lines = append(lines, l)
	}
	require.NoError(t, sc.Err())
	return lines, next
}

// parseCSV decodes a CSV export into lines: a row per value, rows of a
// reading next to each other. Values keep their text and type.
func parseCSV(t *testing.T, body []byte) []exportLine {
	t.Helper()
	rows, err := csv.NewReader(bytes.NewReader(body)).ReadAll()
	require.NoError(t, err)
	require.NotEmpty(t, rows)
	require.Equal(t, []string{"device", "ts", "name", "value", "type"}, rows[0])
	var out []exportLine
	for _, row := range rows[1:] {
		if n := len(out); n == 0 || out[n-1].Device != row[0] || out[n-1].TS != row[1] {
			out = append(out, exportLine{Device: row[0], TS: row[1], Values: map[string]any{}})
		}
		out[len(out)-1].Values[row[2]] = row[4] + ":" + row[3]
	}
	return out
}

// typed renders JSON values the way parseCSV keeps CSV ones.
func typed(t *testing.T, lines []exportLine, kinds map[string]string) []exportLine {
	t.Helper()
	out := make([]exportLine, len(lines))
	for i, l := range lines {
		vs := map[string]any{}
		for name, v := range l.Values {
			switch v := v.(type) {
			case json.Number:
				vs[name] = kinds[name] + ":" + v.String()
			case bool:
				vs[name] = fmt.Sprintf("bool:%t", v)
			case string:
				vs[name] = "string:" + v
			}
		}
		out[i] = exportLine{Device: l.Device, TS: l.TS, Values: vs}
	}
	return out
}

func TestExportEqualsRangeAnswers(t *testing.T) {
	env := exportEnv(t)
	want := rangeAnswers(t, env, []string{"dev-1", "dev-2", "sim-1", "sim-2", "sim-3"})
	require.Len(t, want, 25+32+39+46+53)
	path := "/v1/export" + q("to", testNow.Format(time.RFC3339))

	t.Run("ndjson", func(t *testing.T) {
		r := env.get(t, path)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		assert.Equal(t, "application/x-ndjson", r.header.Get("Content-Type"))
		got, next := parseNDJSON(t, r.body)
		assert.Empty(t, next)
		assert.Equal(t, want, got)
	})
	t.Run("csv", func(t *testing.T) {
		r := env.get(t, path+"&format=csv")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		assert.Equal(t, "text/csv; charset=utf-8; header=present", r.header.Get("Content-Type"))
		assert.Equal(t, typed(t, want, map[string]string{"i": "int", "temp": "float"}), parseCSV(t, r.body))
	})
	t.Run("from and to", func(t *testing.T) {
		from, to := testNow.Add(-30*time.Minute), testNow.Add(-10*time.Minute)
		r := env.get(t, "/v1/export"+q("from", from.Format(time.RFC3339), "to", fmt.Sprint(to.UnixMilli())))
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		got, _ := parseNDJSON(t, r.body)
		var inWindow []exportLine
		for _, l := range want {
			ts, err := time.Parse(time.RFC3339Nano, l.TS)
			require.NoError(t, err)
			if !ts.Before(from) && ts.Before(to) {
				inWindow = append(inWindow, l)
			}
		}
		require.NotEmpty(t, inWindow)
		assert.Equal(t, inWindow, got)
	})
}

// Device patterns of the token and the match and prefix parameters pick
// the devices; a hidden device never appears, even through a cursor
// made by a token that sees it.
func TestExportSelectsDevices(t *testing.T) {
	env := exportEnv(t, withAuth)
	all := rangeAnswers(t, env, []string{"dev-1", "dev-2", "sim-1", "sim-2", "sim-3"}, bearer(readAll)...)
	only := func(devs ...string) []exportLine {
		var out []exportLine
		for _, l := range all {
			for _, d := range devs {
				if l.Device == d {
					out = append(out, l)
				}
			}
		}
		return out
	}
	to := testNow.Format(time.RFC3339)
	for _, tc := range []struct {
		name, token, query string
		want               []exportLine
	}{
		{"all", readAll, q("to", to), all},
		{"patterns", readSim, q("to", to), only("sim-1", "sim-2", "sim-3")},
		{"match", readAll, q("to", to, "match", `{fleet="East"}`), only("sim-1", "sim-3")},
		{"match and patterns", readSim, q("to", to, "match", `{fleet=~"East|West"}`), only("sim-1", "sim-3")},
		{"match on device", readAll, q("to", to, "match", `{device=~"dev-.*"}`), only("dev-1", "dev-2")},
		{"prefix", readAll, q("to", to, "prefix", "sim-"), only("sim-1", "sim-2", "sim-3")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := env.do(t, http.MethodGet, "/v1/export"+tc.query, bearer(tc.token)...)
			require.Equal(t, http.StatusOK, r.status, "%s", r.body)
			got, _ := parseNDJSON(t, r.body)
			assert.Equal(t, tc.want, got)
		})
	}
	t.Run("cursor of a wider token", func(t *testing.T) {
		r := env.do(t, http.MethodGet, "/v1/export"+q("to", to, "limit", "3"), bearer(readAll)...)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		lines, next := parseNDJSON(t, r.body)
		require.Equal(t, "dev-1", lines[0].Device)
		require.NotEmpty(t, next)
		r = env.do(t, http.MethodGet, "/v1/export"+q("cursor", next), bearer(readSim)...)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		got, _ := parseNDJSON(t, r.body)
		assert.Equal(t, only("sim-1", "sim-2", "sim-3"), got)
	})
	t.Run("no token", func(t *testing.T) {
		requireError(t, env.get(t, "/v1/export"), http.StatusUnauthorized, "unauthenticated", "authorization")
	})
	t.Run("write scope only", func(t *testing.T) {
		requireError(t, env.do(t, http.MethodGet, "/v1/export", bearer(writeOnly)...), http.StatusForbidden, "permission_denied", "authorization")
	})
}

// Following the cursors of a limited export yields exactly the
// unlimited export, whatever the limit (a limit that ends on a device's
// last reading included), in both formats; the cursor travels in the
// trailer too.
func TestExportCursorResumes(t *testing.T) {
	env := exportEnv(t)
	to := testNow.Format(time.RFC3339)
	full, _ := parseNDJSON(t, env.get(t, "/v1/export"+q("to", to)).body)
	fullCSV := parseCSV(t, env.get(t, "/v1/export"+q("to", to, "format", "csv")).body)
	for _, limit := range []int{1, 7, 25, 57, 194, 195, 1000} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			var got []exportLine
			var gotCSV []byte
			for _, format := range []string{"ndjson", "csv"} {
				cursor, pages := "", 0
				for {
					res, err := http.Get(env.url + "/v1/export" + q("to", to, "format", format, "limit", fmt.Sprint(limit), "cursor", cursor))
					require.NoError(t, err)
					body, err := io.ReadAll(res.Body)
					require.NoError(t, err)
					require.NoError(t, res.Body.Close())
					require.Equal(t, http.StatusOK, res.StatusCode, "%s", body)
					pages++
					trailer := res.Trailer.Get("Export-Next")
					if format == "ndjson" {
						lines, next := parseNDJSON(t, body)
						assert.LessOrEqual(t, len(lines), limit)
						assert.Equal(t, next, trailer)
						got = append(got, lines...)
					} else {
						if cursor != "" {
							body = bytes.TrimPrefix(body, []byte("device,ts,name,value,type\n"))
						}
						gotCSV = append(gotCSV, body...)
					}
					if trailer == "" {
						break
					}
					cursor = trailer
				}
				assert.Equal(t, (len(full)+limit-1)/limit, pages, format)
			}
			assert.Equal(t, full, got)
			assert.Equal(t, fullCSV, parseCSV(t, gotCSV))
		})
	}
}

func TestExportRejectsBadInput(t *testing.T) {
	env := exportEnv(t)
	r := env.get(t, "/v1/export"+q("to", testNow.Format(time.RFC3339), "limit", "2"))
	_, next := parseNDJSON(t, r.body)
	require.NotEmpty(t, next)
	for _, tc := range []struct{ query, param string }{
		{q("format", "xml"), "format"},
		{q("limit", "0"), "limit"},
		{q("limit", "x"), "limit"},
		{q("from", "abc"), "from"},
		{q("from", "2026-11-22T12:00:00Z", "to", "2026-11-22T11:00:00Z"), "from"},
		{q("match", `{fleet=}`), "match"},
		{q("prefix", "bad/prefix"), "prefix"},
		{q("cursor", "abc"), "cursor"},
		{q("cursor", damagedCursor(next)), "cursor"},
		{q("cursor", next, "format", "csv"), "cursor"},
		{q("cursor", next, "match", `{fleet="East"}`), "cursor"},
		{q("cursor", next, "from", "0"), "cursor"},
	} {
		t.Run(tc.query, func(t *testing.T) {
			requireError(t, env.get(t, "/v1/export"+tc.query), http.StatusBadRequest, "invalid_argument", tc.param)
		})
	}
	t.Run("range cursor", func(t *testing.T) {
		r := env.get(t, "/v1/devices/dev-1/readings"+q("from", "0", "to", testNow.Format(time.RFC3339), "limit", "1"))
		rc := r.json(t)["next"].(string)
		requireError(t, env.get(t, "/v1/export"+q("cursor", rc)), http.StatusBadRequest, "invalid_argument", "cursor")
	})
}

// blockingReader answers the first ranges, then holds every later one
// until its request ends, and reports that end.
type blockingReader struct {
	*fakeReader
	mu      sync.Mutex
	free    int
	held    chan struct{} // closed when a call is held
	ended   chan struct{} // closed when a held call saw its context end
	after   int           // calls made after the end
	endSeen bool
	// deadlines records whether each call had a deadline, and the
	// request context's own.
	deadlines []bool
}

func (b *blockingReader) Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error) {
	_, ok := ctx.Deadline()
	b.mu.Lock()
	b.deadlines = append(b.deadlines, ok)
	if b.endSeen {
		b.after++
	}
	free := b.free > 0
	b.free--
	b.mu.Unlock()
	if free {
		return b.fakeReader.Range(ctx, q)
	}
	select {
	case <-b.held:
	default:
		close(b.held)
	}
	<-ctx.Done()
	b.mu.Lock()
	if !b.endSeen {
		b.endSeen = true
		close(b.ended)
	}
	b.mu.Unlock()
	return buckets.Page{}, ctx.Err()
}

// The export is written as it is read: a client gets its first lines
// while the server cannot go on (it waits on the store for the second
// page), so nothing waits for the whole answer; when the client goes
// away the store call ends and no other starts. Each store call has its
// own deadline.
func TestExportStreamsAndStopsWhenClientGoes(t *testing.T) {
	br := &blockingReader{free: 1, held: make(chan struct{}), ended: make(chan struct{})}
	env := newTestEnv(t, func(c *api.Config) {
		br.fakeReader = newFakeReader()
		c.Reader = br
		c.MaxInFlight = 1
	})
	env.reader = br.fakeReader
	for _, dev := range []string{"dev-a", "dev-b", "dev-c"} {
		wideReadings(t, env, dev, 12000, 20)
		env.reader.devices = append(env.reader.devices, buckets.DeviceInfo{Device: buckets.DeviceID(dev)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, env.url+"/v1/export"+q("to", testNow.Format(time.RFC3339)), nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	rd := bufio.NewReader(res.Body)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(line, `{"device":"dev-a","ts":`), line)
	select {
	case <-br.held:
	case <-time.After(time.Minute):
		t.Fatal("the export never asked for its second page")
	}
	cancel()
	select {
	case <-br.ended:
	case <-time.After(time.Minute):
		t.Fatal("the held store call did not end when the client went away")
	}
	// With one query slot, another query is admitted once the export
	// has let go of it.
	require.Eventually(t, func() bool { return env.get(t, "/v1/tables").status == http.StatusOK },
		time.Minute, 10*time.Millisecond)
	br.mu.Lock()
	defer br.mu.Unlock()
	assert.Zero(t, br.after, "store calls after the client went away")
	for i, ok := range br.deadlines {
		assert.True(t, ok, "store call %d has a deadline", i)
	}
}

// slowReader takes delay over every range call.
type slowReader struct {
	*fakeReader
	delay time.Duration
}

func (r slowReader) Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error) {
	select {
	case <-time.After(r.delay):
	case <-ctx.Done():
		return buckets.Page{}, ctx.Err()
	}
	return r.fakeReader.Range(ctx, q)
}

// The query timeout bounds each store call, not the export: an export
// whose calls together take longer than the timeout finishes whole.
func TestExportOutlivesQueryTimeout(t *testing.T) {
	const timeout, devices = time.Second, 15
	env := newTestEnv(t, func(c *api.Config) {
		c.QueryTimeout = timeout
		c.Reader = slowReader{c.Reader.(*fakeReader), timeout / 10}
	})
	for d := range devices {
		dev := fmt.Sprintf("dev-%02d", d)
		env.reader.add(reading(t, dev, mustTicks(t, "2026-11-22T10:00:00Z"), float64(d)))
		env.reader.devices = append(env.reader.devices, buckets.DeviceInfo{Device: buckets.DeviceID(dev)})
	}
	start := time.Now()
	r := env.get(t, "/v1/export"+q("to", testNow.Format(time.RFC3339)))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	lines, _ := parseNDJSON(t, r.body)
	assert.Len(t, lines, devices)
	require.Greater(t, time.Since(start), timeout, "the export took longer than one query timeout")
}

// Export writes what the endpoint streams.
func TestExportFunction(t *testing.T) {
	env := exportEnv(t)
	want := env.get(t, "/v1/export"+q("to", testNow.Format(time.RFC3339), "format", "csv")).body
	var buf bytes.Buffer
	var seen int64
	n, err := api.Export(context.Background(), env.reader, api.ExportOptions{To: mustTicks(t, testNow.Format(time.RFC3339)), Format: "csv"},
		&buf, func(k int64) { seen = k })
	require.NoError(t, err)
	assert.Equal(t, string(want), buf.String())
	assert.Equal(t, int64(25+32+39+46+53), n)
	assert.Equal(t, n, seen)
	_, err = api.Export(context.Background(), env.reader, api.ExportOptions{Format: "xml"}, io.Discard, nil)
	assert.ErrorContains(t, err, "xml")
}

// failingReader answers the first free ranges, then fails every one.
type failingReader struct {
	*fakeReader
	free atomic.Int32
}

func (r *failingReader) Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error) {
	if r.free.Add(-1) < 0 {
		return buckets.Page{}, errors.New("disk on fire")
	}
	return r.fakeReader.Range(ctx, q)
}

// A store failure before the first byte is a JSON error; after it the
// transfer is aborted, so the client cannot take a short export for a
// whole one.
func TestExportFailureIsNeverAShortExport(t *testing.T) {
	fr := &failingReader{}
	env := newTestEnv(t, func(c *api.Config) {
		fr.fakeReader = c.Reader.(*fakeReader)
		c.Reader = fr
	})
	for _, dev := range []string{"dev-a", "dev-b"} {
		wideReadings(t, env, dev, 12000, 20)
		env.reader.devices = append(env.reader.devices, buckets.DeviceInfo{Device: buckets.DeviceID(dev)})
	}
	path := "/v1/export" + q("to", testNow.Format(time.RFC3339))

	fr.free.Store(0)
	requireError(t, env.get(t, path), http.StatusInternalServerError, "internal", "")

	fr.free.Store(1)
	res, err := http.Get(env.url + path)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	body, err := io.ReadAll(res.Body)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Greater(t, bytes.Count(body, []byte("\n")), 1000, "the first page was sent")
	require.Eventually(t, func() bool { return strings.Contains(env.logs.String(), "export failed mid-stream") },
		time.Minute, 10*time.Millisecond)
	assert.Contains(t, env.logs.String(), "disk on fire")
}

// An export holds a full range page of the response budget for as long
// as it streams: with room for one, a second export is refused at once
// while the first waits on the store, and admitted once it has ended.
func TestExportHoldsItsShareOfTheBudget(t *testing.T) {
	br := &blockingReader{held: make(chan struct{}), ended: make(chan struct{})}
	env := newTestEnv(t, func(c *api.Config) {
		br.fakeReader = c.Reader.(*fakeReader)
		c.Reader = br
		c.ResponseBudget = 3 << 20 // one export's 2.5 MiB
		c.ClientShares = 1
	})
	env.reader.add(reading(t, "dev-a", mustTicks(t, "2026-11-22T10:00:00Z"), 1))
	env.reader.devices = []buckets.DeviceInfo{{Device: "dev-a"}}
	path := "/v1/export" + q("to", testNow.Format(time.RFC3339))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, env.url+path, nil)
		if res, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
		}
	}()
	select {
	case <-br.held:
	case <-time.After(time.Minute):
		t.Fatal("the first export never reached the store")
	}
	r := env.get(t, path)
	requireError(t, r, http.StatusServiceUnavailable, "unavailable", "query responses")
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	cancel()
	<-done
	br.mu.Lock()
	br.free = 1 << 30
	br.mu.Unlock()
	require.Eventually(t, func() bool { return env.get(t, path).status == http.StatusOK }, time.Minute, 10*time.Millisecond)
}

// damagedCursor changes one character in the middle of a cursor. A
// middle character carries six bits of the decoded cursor, so the
// change always reaches its bytes; the last characters may carry only
// padding bits, or already be what a fixed replacement writes.
func damagedCursor(c string) string {
	b := []byte(c)
	i := len(b) / 2
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}
