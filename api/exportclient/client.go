// Package exportclient is a client of GET /v1/export: it asks a running
// telemetryd for the readings of every matching device a page at a time
// and writes them, as one NDJSON or CSV stream, to an io.Writer.
//
// A transfer that breaks (a reset connection, a cut body, a 429 or 503
// answer) is asked again from the cursor of its page, and what the
// writer already received is skipped: the client writes whole records
// only and resumes behind the last one written, so the output has no
// duplicate and no gap. Other refusals (401, 403, 400) are returned
// with the service's message and not retried.
//
// Query.Options gives the same selection to api.Export, which writes
// the same stream from a store without a service; Progress reports the
// running count of either.
package exportclient

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// DefaultPage is the default Client.Page: readings per request.
const DefaultPage = 1_000_000

// DefaultRetries is the default Client.Retries.
const DefaultRetries = 5

// DefaultBackoff is the default Client.Backoff.
const DefaultBackoff = time.Second

// Query selects what Export asks. The fields are sent as the query
// parameters of the same name; empty ones are left out.
type Query struct {
	// Match is a Prometheus selector over device attributes and the
	// label device.
	Match string
	// Prefix keeps devices whose ID starts with it.
	Prefix string
	// From (inclusive) and To (exclusive), RFC 3339 or epoch
	// milliseconds.
	From, To string
	// Format is api.FormatNDJSON (default) or api.FormatCSV.
	Format string
}

// Client asks one service for exports. The zero value of each field
// but URL means its default.
type Client struct {
	// URL is the service's base URL, http:// or https://host[:port].
	URL string
	// Token is the bearer token (with the read scope); empty: none.
	Token string
	// HTTP makes the requests; nil: a client over
	// http.DefaultTransport with no overall timeout (an export may
	// take long).
	HTTP *http.Client
	// Page is the readings per request (default DefaultPage); a broken
	// transfer resumes within its page.
	Page int64
	// Retries is how often in a row a broken transfer is resumed
	// before Export gives up (default DefaultRetries; negative: never).
	Retries int
	// Backoff is the wait before the first resume; the n-th resume in
	// a row waits n times it (default DefaultBackoff).
	Backoff time.Duration
	// OnResume, when set, is called before each resume with the error
	// that broke the transfer and the attempt number.
	OnResume func(err error, attempt, retries int)
}

// errOutput marks a failure to write the output (not worth a retry).
var errOutput = errors.New("write output")

// Export writes the readings q selects to w, devices in ID order and
// each device's readings oldest first, and returns how many it wrote.
// progress, when set, is called with the running count now and then.
// It returns when the last page is written, on an error not worth a
// retry, after Retries resumes in a row, or when ctx ends.
func (c *Client) Export(ctx context.Context, q Query, w io.Writer, progress func(readings int64)) (int64, error) {
	base, err := url.Parse(strings.TrimRight(c.URL, "/") + "/v1/export")
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return 0, fmt.Errorf("URL %q is not an http:// or https:// URL", c.URL)
	}
	format := q.Format
	if format == "" {
		format = api.FormatNDJSON
	}
	if format != api.FormatNDJSON && format != api.FormatCSV {
		return 0, fmt.Errorf("format %q is not %s or %s", format, api.FormatNDJSON, api.FormatCSV)
	}
	page, retries, backoff := c.Page, c.Retries, c.Backoff
	if page == 0 {
		page = DefaultPage
	}
	if page < 0 {
		return 0, fmt.Errorf("page %d is not positive", page)
	}
	if retries == 0 {
		retries = DefaultRetries
	}
	if backoff <= 0 {
		backoff = DefaultBackoff
	}
	client := c.HTTP
	if client == nil {
		client = &http.Client{Transport: http.DefaultTransport}
	}
	cp := &copier{w: w, csv: format == api.FormatCSV, progress: progress}
	cursor, attempt := "", 0
	for {
		v := url.Values{"format": {format}, "limit": {strconv.FormatInt(page, 10)}}
		if cursor != "" {
			v.Set("cursor", cursor)
		} else {
			for k, s := range map[string]string{"match": q.Match, "prefix": q.Prefix, "from": q.From, "to": q.To} {
				if s != "" {
					v.Set(k, s)
				}
			}
		}
		u := *base
		u.RawQuery = v.Encode()
		next, retry, err := c.fetch(ctx, client, u.String(), cp)
		switch {
		case err == nil && next == "":
			return cp.readings, nil
		case err == nil:
			cursor, attempt = next, 0
		case retry && attempt < retries && ctx.Err() == nil:
			attempt++
			if c.OnResume != nil {
				c.OnResume(err, attempt, retries)
			}
			cp.resume()
			t := time.NewTimer(time.Duration(attempt) * backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return cp.readings, ctx.Err()
			}
		default:
			return cp.readings, err
		}
	}
}

// fetch asks one page and copies it. retry reports an error worth
// resuming after (a broken transfer, a refusal for load).
func (c *Client) fetch(ctx context.Context, client *http.Client, u string, cp *copier) (next string, retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", false, fmt.Errorf("request: %w", err)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	res, err := client.Do(req)
	if err != nil {
		return "", true, fmt.Errorf("request: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		retry := res.StatusCode == http.StatusTooManyRequests || res.StatusCode == http.StatusServiceUnavailable
		return "", retry, fmt.Errorf("%s: %s", res.Status, bytes.TrimSpace(body))
	}
	if err := cp.copy(res.Body); err != nil {
		return "", !errors.Is(err, errOutput), err
	}
	return res.Trailer.Get("Export-Next"), false, nil
}

// copier copies export responses to the output a whole record at a
// time (a CSV record may span lines inside quotes), drops the repeated
// CSV header and the NDJSON cursor lines, and after a broken transfer
// drops what it already wrote.
type copier struct {
	w        io.Writer
	csv      bool
	progress func(int64)
	header   bool   // the CSV header was written
	rec      []byte // the record being read
	last     []byte // the last record written
	lastKey  []byte // device and ts of the last CSV row written
	skipTo   []byte // after a resume: skip records up to this one
	readings int64
}

// resume makes the next response skip what was written already.
func (c *copier) resume() {
	if len(c.last) > 0 {
		c.skipTo = append(c.skipTo[:0], c.last...)
	}
}

func (c *copier) copy(body io.Reader) error {
	r := bufio.NewReaderSize(body, 256<<10)
	first := true
	for {
		line, err := r.ReadSlice('\n')
		c.rec = append(c.rec, line...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			c.rec = c.rec[:0] // an incomplete record is never written
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("read response: %w", err)
		}
		if c.csv && bytes.Count(c.rec, []byte{'"'})%2 == 1 {
			continue // a line break inside a quoted value
		}
		rec := c.rec
		c.rec = c.rec[:0]
		if err := c.record(rec, first); err != nil {
			return err
		}
		first = false
	}
}

// record handles one complete record of a response.
func (c *copier) record(rec []byte, first bool) error {
	switch {
	case c.csv && first:
		if c.header {
			return nil
		}
		c.header = true
		return c.write(rec)
	case !c.csv && bytes.HasPrefix(rec, []byte(`{"next":`)):
		return nil
	}
	if c.skipTo != nil {
		if before(rec, c.skipTo, c.csv) {
			return nil
		}
		c.skipTo = nil
	}
	if c.csv {
		key := csvKey(rec)
		if !bytes.Equal(key, c.lastKey) {
			c.readings++
			c.lastKey = append(c.lastKey[:0], key...)
		}
	} else {
		c.readings++
	}
	c.last = append(c.last[:0], rec...)
	if err := c.write(rec); err != nil {
		return err
	}
	if c.progress != nil && c.readings%1024 == 0 {
		c.progress(c.readings)
	}
	return nil
}

func (c *copier) write(b []byte) error {
	if _, err := c.w.Write(b); err != nil {
		return fmt.Errorf("%w: %w", errOutput, err)
	}
	return nil
}

// csvKey is the device,ts part of a CSV row.
func csvKey(rec []byte) []byte {
	i := bytes.IndexByte(rec, ',')
	if i < 0 {
		return rec
	}
	j := bytes.IndexByte(rec[i+1:], ',')
	if j < 0 {
		return rec
	}
	return rec[:i+1+j]
}

// before reports whether record rec comes at or before record last in
// export order: device, then time, then (CSV) value name.
func before(rec, last []byte, csv bool) bool {
	d1, t1, n1 := posOf(rec, csv)
	d2, t2, n2 := posOf(last, csv)
	if d1 != d2 {
		return d1 < d2
	}
	if t1 != t2 {
		return t1 < t2
	}
	return n1 <= n2
}

// posOf reads device, time and (CSV) value name of a record.
func posOf(rec []byte, csv bool) (dev string, ts buckets.Ticks, name string) {
	if csv {
		f := strings.SplitN(string(rec), ",", 4)
		if len(f) < 3 {
			return "", 0, ""
		}
		ts, _ = buckets.ParseTime(f[1])
		return f[0], ts, f[2]
	}
	s := string(rec)
	dev = between(s, `{"device":"`, `"`)
	ts, _ = buckets.ParseTime(between(s, `"ts":"`, `"`))
	return dev, ts, ""
}

// between is the part of s after start and before the next end.
func between(s, start, end string) string {
	_, after, ok := strings.Cut(s, start)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(after, end)
	return v
}
