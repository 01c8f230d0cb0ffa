package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// verifier reads every reading back over the HTTP API.
type verifier struct {
	base string
	pub  *publisher
}

type tablesResponse struct {
	Tables []struct {
		Readings *int64 `json:"readings"` // absent when the service does not know it
	} `json:"tables"`
}

// waitStored polls the tables' reading counts until they reach what
// was acked (ingest may still be catching up after the last restart).
// A table whose count the service does not know (it was being written
// when the service was killed and has not been opened since, so
// /v1/tables leaves its count out) makes it count the readings over the
// range API instead.
func (v verifier) waitStored(ctx context.Context, timeout time.Duration) error {
	want := v.pub.acked.Load()
	deadline := time.Now().Add(timeout)
	var got int64
	for time.Now().Before(deadline) {
		if n, err := v.stored(ctx); err == nil {
			got = n
			if got >= want {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("tables hold %d readings, %d were acked", got, want)
}

// stored is the number of readings the service holds: the sum of the
// tables' counts when every count is known, else a count of the
// readings read back.
func (v verifier) stored(ctx context.Context) (int64, error) {
	var tr tablesResponse
	if err := getJSON(ctx, v.base+"/v1/tables", &tr); err != nil {
		return 0, err
	}
	var n int64
	for _, t := range tr.Tables {
		if t.Readings == nil {
			var res Result
			err := v.check(ctx, &res)
			return int64(res.Stored), err
		}
		n += *t.Readings
	}
	return n, nil
}

type rangeResponse struct {
	Readings []struct {
		TS     string         `json:"ts"`
		Values map[string]any `json:"values"`
	} `json:"readings"`
	Next string `json:"next"`
}

// check reads every device's readings and counts lost, duplicated and
// unexpected ones into res.
func (v verifier) check(ctx context.Context, res *Result) error {
	seen := make([]int, v.pub.cfg.Readings)
	from := v.pub.base.Add(-time.Second)
	to := v.pub.base.Add(time.Duration(v.pub.cfg.Readings)*time.Millisecond + time.Second)
	for d := 0; d < v.pub.cfg.Devices; d++ {
		q := url.Values{"from": {from.Format(time.RFC3339Nano)}, "to": {to.Format(time.RFC3339Nano)},
			"order": {"asc"}, "limit": {"10000"}}
		for {
			var rr rangeResponse
			if err := getJSON(ctx, v.base+"/v1/devices/"+v.pub.device(d)+"/readings?"+q.Encode(), &rr); err != nil {
				return err
			}
			for _, r := range rr.Readings {
				res.Stored++
				seq, ok := r.Values["seq"].(float64)
				ts, err := time.Parse(time.RFC3339Nano, r.TS)
				if !ok || err != nil || seq < 0 || int(seq) >= len(seen) ||
					ts.UnixMilli() != v.pub.base.UnixMilli()+int64(seq) {
					res.Unexpected++
					continue
				}
				seen[int(seq)]++
			}
			if rr.Next == "" {
				break
			}
			q.Set("cursor", rr.Next)
		}
	}
	for _, n := range seen {
		switch {
		case n == 0:
			res.Lost++
		case n > 1:
			res.Duplicated += n - 1
		}
	}
	return nil
}

func getJSON(ctx context.Context, u string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, strconv.Itoa(resp.StatusCode))
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
