package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/telemetryd/telemetryd/cmd/internal/exactlyonce"
)

// verifier reads every reading back over the HTTP API.
type verifier struct {
	base   string
	pub    *publisher
	header http.Header // sent with every request (Authorization); may be nil
	// settle ends waitStored early once the count has not moved for
	// this long (0: wait for the whole timeout).
	settle time.Duration
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
	moved := time.Now()
	for time.Now().Before(deadline) {
		if n, err := v.stored(ctx); err == nil {
			if n != got {
				moved = time.Now()
			}
			got = n
			if got >= want {
				return nil
			}
		}
		if v.settle > 0 && time.Since(moved) > v.settle {
			return fmt.Errorf("tables hold %d readings, %d were acked, no change for %s", got, want, v.settle)
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
	if err := getJSON(ctx, v.base+"/v1/tables", v.header, &tr); err != nil {
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

// check reads every device's readings and counts lost, duplicated and
// unexpected ones into res with the shared exactly-once checker. The
// readings of every acked message are due (all of them, unless
// publishing stalled); any reading of the run may appear.
func (v verifier) check(ctx context.Context, res *Result) error {
	cfg := v.pub.cfg
	from := v.pub.base.Add(-time.Second)
	to := v.pub.base.Add(time.Duration(cfg.Readings)*time.Millisecond + time.Second)
	var total, dup exactlyonce.Tally
	for d := range cfg.Devices {
		got, err := exactlyonce.ReadDevice(ctx, nil, v.base, v.pub.device(d), from, to, v.header)
		if err != nil {
			return err
		}
		run := exactlyonce.Run{Field: v.pub.seqField(), Base: v.pub.base, Step: time.Millisecond,
			Published: func(seq int) bool { return seq < cfg.Readings && v.pub.deviceOf(seq) == d }}
		var acked, ackedDup []int
		for seq := range cfg.Readings {
			if m := seq / cfg.Batch; v.pub.deviceOf(seq) == d && v.pub.ackedMsg[m] {
				acked = append(acked, seq)
				if v.pub.dupAcked[m].Load() {
					ackedDup = append(ackedDup, seq)
				}
			}
		}
		total.Add(run.Check(acked, got))
		dup.Add(run.Check(ackedDup, got))
		ages, cuts, seqs := v.lostAges(run, acked, got, res.Cuts)
		res.LostAges = append(res.LostAges, ages...)
		res.LostCuts = append(res.LostCuts, cuts...)
		res.LostSeqs = append(res.LostSeqs, seqs...)
	}
	res.Stored, res.Lost, res.Duplicated, res.Unexpected = total.Stored, total.Lost, total.Duplicated, total.Unexpected
	res.LostAckedDuplicate = dup.Lost
	return nil
}

// lostAges returns, for every acked reading not read back, its age at
// the first cut after its ack (how long it had been acked when the power
// went), that cut's number (from 1) and the reading's number; a reading
// lost without a cut after its ack counts with age -1 and cut 0.
func (v verifier) lostAges(run exactlyonce.Run, acked []int, got []exactlyonce.Reading, cuts []cut) ([]time.Duration, []int, []int) {
	seen := make(map[int]bool, len(got))
	for _, r := range got {
		if n, ok := run.Ident(r); ok {
			seen[n] = true
		}
	}
	var out []time.Duration
	var which, seqs []int
	for _, seq := range acked {
		if seen[seq] {
			continue
		}
		at := v.pub.ackedAt[seq/v.pub.cfg.Batch]
		age, n := time.Duration(-1), 0
		for i, c := range cuts {
			if !c.At.Before(at) {
				age, n = c.At.Sub(at), i+1
				break
			}
		}
		out = append(out, age)
		which = append(which, n)
		seqs = append(seqs, seq)
	}
	return out, which, seqs
}

func getJSON(ctx context.Context, u string, header http.Header, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	for k, vs := range header {
		req.Header[k] = vs
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
