// Package exactlyonce judges telemetryd's delivery guarantee end to
// end: every reading whose publish was acknowledged is stored exactly
// once, and nothing that was never published is stored. The crash loop
// (cmd/telemetry-crashloop) judges a single node with it; the cluster
// tests judge every copy of every device of a cluster with it, and the
// answers of every node.
//
// A run numbers its readings; Ident recovers the number of a reading
// read back (from its values and its timestamp, which must agree) and
// Check counts, against the numbers acked, what was lost, duplicated or
// never published. ReadDevice reads all of a device's readings over the
// HTTP API, following the cursor, so that no answer size caps the check.
package exactlyonce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Tally is what a check found.
type Tally struct {
	Acked      int // readings acked
	Stored     int // readings read back
	Lost       int // acked, not read back
	Duplicated int // read back more than once (each extra time)
	Unexpected int // read back but never published, or not of the run's form
}

// OK reports whether the guarantee held: nothing lost, duplicated or
// unexpected.
func (t Tally) OK() bool { return t.Lost == 0 && t.Duplicated == 0 && t.Unexpected == 0 }

// Add adds o's counts to t.
func (t *Tally) Add(o Tally) {
	t.Acked += o.Acked
	t.Stored += o.Stored
	t.Lost += o.Lost
	t.Duplicated += o.Duplicated
	t.Unexpected += o.Unexpected
}

// String is the counts as key=value pairs.
func (t Tally) String() string {
	return fmt.Sprintf("acked=%d stored=%d lost=%d duplicated=%d unexpected=%d", t.Acked, t.Stored, t.Lost, t.Duplicated, t.Unexpected)
}

// Reading is a reading as the HTTP API returns it.
type Reading struct {
	TS     time.Time      `json:"ts"`
	Values map[string]any `json:"values"`
}

// Run describes how a run numbered its readings.
type Run struct {
	// Field is the value carrying the reading's number.
	Field string
	// Base and Step stamp reading n at Base + n*Step.
	Base time.Time
	Step time.Duration
	// Published reports whether number n was ever published (acked or
	// not); nil accepts any n >= 0.
	Published func(n int) bool
}

// Ident returns the number of r, false when r is not a reading of the
// run (no number, or a timestamp other than the number's).
func (run Run) Ident(r Reading) (int, bool) {
	var n int
	switch v := r.Values[run.Field].(type) {
	case float64: // as JSON decodes it
		if v < 0 || v != float64(int(v)) {
			return 0, false
		}
		n = int(v)
	case int64:
		n = int(v)
	default:
		return 0, false
	}
	if n < 0 {
		return 0, false
	}
	if !r.TS.Equal(run.Base.Add(time.Duration(n) * run.Step)) {
		return 0, false
	}
	if run.Published != nil && !run.Published(n) {
		return 0, false
	}
	return n, true
}

// Check counts the readings read back against the numbers acked.
func (run Run) Check(acked []int, got []Reading) Tally {
	t := Tally{Acked: len(acked), Stored: len(got)}
	seen := make(map[int]int, len(got))
	for _, r := range got {
		n, ok := run.Ident(r)
		if !ok {
			t.Unexpected++
			continue
		}
		seen[n]++
		if seen[n] > 1 {
			t.Duplicated++
		}
	}
	for _, n := range acked {
		if seen[n] == 0 {
			t.Lost++
		}
	}
	return t
}

// pageLimit is the page size ReadDevice asks for.
const pageLimit = 10000

// maxPages bounds the pages ReadDevice follows, so a cursor that never
// ends is an error rather than a hang.
const maxPages = 10000

// ReadDevice reads every reading of device from base's HTTP API with
// from <= ts < to, oldest first, following the cursor. header (may be
// nil) is sent with every request (e.g. Authorization).
func ReadDevice(ctx context.Context, c *http.Client, base, device string, from, to time.Time, header http.Header) ([]Reading, error) {
	if c == nil {
		c = http.DefaultClient
	}
	q := url.Values{"from": {from.Format(time.RFC3339Nano)}, "to": {to.Format(time.RFC3339Nano)},
		"order": {"asc"}, "limit": {strconv.Itoa(pageLimit)}}
	var out []Reading
	for range maxPages {
		var page struct {
			Readings []Reading `json:"readings"`
			Next     string    `json:"next"`
		}
		u := base + "/v1/devices/" + url.PathEscape(device) + "/readings?" + q.Encode()
		if err := getJSON(ctx, c, u, header, &page); err != nil {
			return out, err
		}
		out = append(out, page.Readings...)
		if page.Next == "" {
			return out, nil
		}
		q.Set("cursor", page.Next)
	}
	return out, fmt.Errorf("readings of %s: more than %d pages", device, maxPages)
}

// errStatus is a non-200 answer.
var errStatus = errors.New("unexpected status")

func getJSON(ctx context.Context, c *http.Client, u string, header http.Header, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %w %d: %s", u, errStatus, resp.StatusCode, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("GET %s: decode: %w", u, err)
	}
	return nil
}
