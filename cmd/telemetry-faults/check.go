package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/telemetryd/telemetryd/cmd/internal/exactlyonce"
)

// seqOf returns the number a stored reading carries and whether it is
// stamped with that number's time: "seq" as JSON publishes store it,
// "f_seq" as line protocol writes do (measurement f, field seq).
func (l *ledger) seqOf(r exactlyonce.Reading) (int, bool) {
	for _, name := range []string{"seq", "f_seq"} {
		if v, ok := r.Values[name].(float64); ok && v >= 0 && v == float64(int(v)) {
			n := int(v)
			return n, r.TS.Equal(l.ts(n))
		}
	}
	return 0, false
}

// judgement is what comparing one device's readings with the ledger
// found.
type judgement struct {
	missing       []int // acked (before the cut-off), not in the answer
	duplicated    []int
	misattributed []int // a reading of another device
	unexpected    int   // not a reading the harness sent, or stamped wrong
}

// judge compares the readings got for device d with the readings of d
// acked before cutoff.
func (l *ledger) judge(d int, got []exactlyonce.Reading, cutoff time.Time) judgement {
	var j judgement
	seen := map[int]int{}
	for _, r := range got {
		n, ok := l.seqOf(r)
		e, sent := l.get(n)
		switch {
		case !ok || !sent:
			j.unexpected++
			continue
		case e.dev != d:
			j.misattributed = append(j.misattributed, n)
			continue
		}
		seen[n]++
		if seen[n] == 2 {
			j.duplicated = append(j.duplicated, n)
		}
	}
	for _, n := range l.ackedOf(d, cutoff) {
		if seen[n] == 0 {
			j.missing = append(j.missing, n)
		}
	}
	slices.Sort(j.missing)
	return j
}

// query is one read during the run and what the harness made of it.
type query struct {
	answer
	device  int
	verdict string // ok, unavailable (503 naming the partition), no-answer, or the violation
	bad     bool
}

// querier reads random devices from random nodes while faults happen,
// and checks every answer against the ledger: an answer is correct
// (every reading acked before staleBound ago is there, nothing else
// is), or marked partial for the device's partition (a
// Telemetry-Warning header "partial: partition N ...", api/cluster
// PartialWarning: read from an owner whose copy trails its stream; it
// may miss readings, never hold a wrong one), or a 503 that names the
// device's partition, or no answer at all (a paused or cut-off node).
type querier struct {
	led        *ledger
	nodes      []string
	rng        *rand.Rand
	every      time.Duration
	staleBound time.Duration
	client     *http.Client

	mu      sync.Mutex
	queries []query
}

func (q *querier) run(ctx context.Context) {
	for ctx.Err() == nil {
		sleepCtx(ctx, q.every)
		if ctx.Err() != nil {
			return
		}
		j, d := q.rng.IntN(len(q.nodes)), q.rng.IntN(q.led.devices)
		res := q.one(ctx, j, d)
		if ctx.Err() != nil {
			return
		}
		q.mu.Lock()
		q.queries = append(q.queries, res)
		q.mu.Unlock()
	}
}

// one asks node j for every reading of device d and judges the answer.
func (q *querier) one(ctx context.Context, j, d int) query {
	sent := time.Now()
	res := query{answer: answer{at: sent, node: fmt.Sprintf("node-%d", j), partition: q.led.partitionOf(d)}, device: d}
	base := q.nodes[j]
	u := base + "/v1/devices/" + url.PathEscape(deviceName(d)) + "/readings?" + url.Values{
		"from": {q.led.base.Format(time.RFC3339Nano)}, "to": {q.led.base.Add(24 * time.Hour).Format(time.RFC3339Nano)},
		"order": {"asc"}, "limit": {"10000"}}.Encode()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := q.client.Do(req)
	if err != nil {
		res.verdict = "no-answer"
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil { // cut off by the client's timeout on a slow link: no answer
		res.verdict = "no-answer"
		return res
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusServiceUnavailable:
		if strings.Contains(string(body), "partition "+strconv.Itoa(res.partition)) {
			res.verdict = "unavailable"
		} else {
			res.verdict, res.bad = fmt.Sprintf("503 not naming partition %d: %.200s", res.partition, body), true
		}
		return res
	default:
		res.verdict, res.bad = fmt.Sprintf("status %d: %.200s", resp.StatusCode, body), true
		return res
	}
	var page struct {
		Readings []exactlyonce.Reading `json:"readings"`
		Next     string                `json:"next"`
	}
	partial := markedPartial(resp.Header, res.partition)
	if err := json.Unmarshal(body, &page); err != nil {
		res.verdict, res.bad = "undecodable answer: "+err.Error(), true
		return res
	}
	if page.Next != "" {
		res.verdict = "ok (first page only)"
		return res
	}
	jd := q.led.judge(d, page.Readings, sent.Add(-q.staleBound))
	switch {
	case len(jd.misattributed) > 0 || jd.unexpected > 0 || len(jd.duplicated) > 0:
		res.verdict, res.bad = fmt.Sprintf("wrong answer: misattributed=%v duplicated=%v unexpected=%d", head(jd.misattributed), head(jd.duplicated), jd.unexpected), true
	case partial:
		res.verdict = "partial (marked)"
	case len(jd.missing) > 0:
		e, _ := q.led.get(jd.missing[0])
		res.verdict, res.bad = fmt.Sprintf("silently partial: %d readings acked more than %s before the query missing, e.g. seq %d acked %s via %s",
			len(jd.missing), q.staleBound, jd.missing[0], e.acked.Format(time.RFC3339Nano), e.via), true
	default:
		res.verdict = "ok"
	}
	return res
}

func head(s []int) []int { return s[:min(len(s), 5)] }

// markedPartial reports whether an answer's headers mark it partial for
// partition p (api/cluster PartialWarning).
func markedPartial(h http.Header, p int) bool {
	return slices.ContainsFunc(h.Values("Telemetry-Warning"), func(w string) bool {
		return strings.HasPrefix(w, fmt.Sprintf("partial: partition %d ", p))
	})
}

// results returns the queries so far.
func (q *querier) results() []query {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.queries)
}

// serving samples, every interval, which partitions each node says it
// answers for (its own lease's ready partitions, from its own
// /v1/cluster), and finds intervals in which more nodes than copies+1
// (a hand-over overlaps by one) claimed a partition for longer than
// the lease TTL.
type serving struct {
	nodes  []string
	client *http.Client
	every  time.Duration

	mu      sync.Mutex
	samples []servingSample
}

type servingSample struct {
	at       time.Time
	node     int
	ready    []int // nil: no answer
	trailing []int // those of ready whose copy trails its stream
	answer   bool
}

func (s *serving) run(ctx context.Context) {
	for ctx.Err() == nil {
		for j, base := range s.nodes {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			v, err := getClusterView(cctx, s.client, base)
			cancel()
			smp := servingSample{at: time.Now(), node: j, answer: err == nil}
			if err == nil {
				self := fmt.Sprintf("node-%d", j)
				for _, n := range v.Nodes {
					if n.Node == self {
						smp.ready, smp.trailing = n.Ready, n.Trailing
					}
				}
			}
			s.mu.Lock()
			s.samples = append(s.samples, smp)
			s.mu.Unlock()
		}
		sleepCtx(ctx, s.every)
	}
}

// trailingSeen counts, per node and partition ("node-1 p3"), the
// samples in which the node said it answered the partition from a copy
// trailing its stream.
func (s *serving) trailingSeen() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, smp := range s.samples {
		for _, p := range smp.trailing {
			out[fmt.Sprintf("node-%d p%d", smp.node, p)]++
		}
	}
	return out
}

// overServed is an interval in which a partition had more
// self-declared servers than allowed.
type overServed struct {
	partition int
	from, to  time.Time
	nodes     []int
}

// doubleServing returns the intervals longer than ttl in which more
// than allowed nodes said they answer for one partition. A node that
// does not answer does not count (it serves nobody).
func (s *serving) doubleServing(partitions, allowed int, ttl time.Duration) []overServed {
	s.mu.Lock()
	samples := slices.Clone(s.samples)
	s.mu.Unlock()
	claims := map[int][]int{} // node -> its last answered ready list
	open := map[int]*overServed{}
	var out []overServed
	for _, smp := range samples {
		if smp.answer {
			claims[smp.node] = smp.ready
		} else {
			delete(claims, smp.node)
		}
		for p := range partitions {
			var who []int
			for n, r := range claims {
				if slices.Contains(r, p) {
					who = append(who, n)
				}
			}
			slices.Sort(who)
			o := open[p]
			switch {
			case len(who) > allowed && o == nil:
				open[p] = &overServed{partition: p, from: smp.at, to: smp.at, nodes: who}
			case len(who) > allowed:
				o.to = smp.at
			case o != nil:
				if o.to.Sub(o.from) > ttl {
					out = append(out, *o)
				}
				delete(open, p)
			}
		}
	}
	for _, o := range open {
		if o.to.Sub(o.from) > ttl {
			out = append(out, *o)
		}
	}
	return out
}
