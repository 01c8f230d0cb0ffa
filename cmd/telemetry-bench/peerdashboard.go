package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// dashboardSlide is how far the window moves from one refresh to the
// next, and with dashboardConfig.Wait the wall time between them: a
// Grafana dashboard refreshed every 10 s.
const dashboardSlide = 10 * time.Second

// dashboardConfig is the fleet dashboard of the peer comparison
// (-fleet-dashboard): Refreshes times, every fleet question asked of
// each service as a range query over Window at Step, the window ending
// Refreshes-1 slides before the file's newest time at the first
// refresh and at it at the last.
type dashboardConfig struct {
	Refreshes int
	Window    time.Duration
	Step      time.Duration
	Wait      bool // wait dashboardSlide of wall time between refreshes
}

// dashboardRange is refresh i's range query parameters: start and end
// aligned down to the step, as Grafana aligns them.
func (c dashboardConfig) dashboardRange(newest time.Time, i int) url.Values {
	end := newest.Add(-time.Duration(c.Refreshes-1-i) * dashboardSlide).Truncate(c.Step)
	return url.Values{"start": {promTime(end.Add(-c.Window))}, "end": {promTime(end)},
		"step": {fmt.Sprint(int64(c.Step / time.Second))}}
}

// peerDashboard asks the fleet questions of svc and the peer p as a
// dashboard does: cfg.Dashboard.Refreshes refreshes, each every
// question (the per-fleet ones of the East fleet) as a range query, one
// at a time, first of one service and then of the other (the order
// swapped every other refresh). The data is history, so the window
// slides over the file's time rather than the clock's; with -dashboard-wait
// each refresh also begins 10 s after the one before.
func (b *bench) peerDashboard(ctx context.Context, svc *service, p *peerService, peerQuery url.Values, d *peerData) ([]questionResult, error) {
	dc := b.cfg.Dashboard
	qs := fleetQuestions("6h")
	out := make([]questionResult, len(qs))
	ours := make([][]time.Duration, len(qs))
	peer := make([][]time.Duration, len(qs))
	for j, q := range qs {
		out[j] = questionResult{Name: q.Name, Query: q.Query(telemetrydDialect, "East"), PeerQuery: q.Query(peerDialect, "East")}
	}
	ph := b.prog.begin(fmt.Sprintf("fleet dashboard: %d refreshes of %d questions", dc.Refreshes, len(qs)), 2*dc.Refreshes*len(qs), "queries")
	stopProfile := b.profile(ctx, svc, "fleet-dashboard")
	defer stopProfile()
	var began time.Time
	for i := range dc.Refreshes {
		if dc.Wait && i > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Until(began.Add(dashboardSlide))):
			}
		}
		began = time.Now()
		rng := dc.dashboardRange(d.end, i)
		type side struct {
			client *http.Client
			url    func(j int) string
			ds     [][]time.Duration
			peer   bool
			failed func(j int) *int
		}
		sides := []side{
			{svc.client, func(j int) string {
				return svc.url("/api/v1/query_range?" + withQuery(rng, "query", out[j].Query).Encode())
			}, ours, false, func(j int) *int { return &out[j].OurFailed }},
			{p.client, func(j int) string {
				return p.url("/api/v1/query_range?" + withQuery(withQuery(peerQuery, rangePairs(rng)...), "query", out[j].PeerQuery).Encode())
			}, peer, true, func(j int) *int { return &out[j].PeerFailed }},
		}
		if i%2 == 1 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, s := range sides {
			for j := range qs {
				start := time.Now()
				body, err := getBody(ctx, s.client, s.url(j))
				s.ds[j] = append(s.ds[j], time.Since(start))
				switch {
				case ctx.Err() != nil:
					return nil, ctx.Err()
				case err != nil: // a timeout: counted, its time kept
					if *s.failed(j)++; *s.failed(j) == 1 {
						b.prog.logf("refresh %d, %s: %v", i+1, qs[j].Name, err)
					}
				}
				if i == dc.Refreshes-1 {
					if s.peer {
						out[j].PeerSe = countSeries(body)
					} else {
						out[j].OurSeries = countSeries(body)
					}
				}
				ph.add(1)
			}
		}
	}
	for j := range out {
		out[j].Ours, out[j].Peer = summarize(ours[j]), summarize(peer[j])
		out[j].OurFirst, out[j].PeerFirst = ours[j][0], peer[j][0]
	}
	ph.end("")
	return out, nil
}

// rangePairs is the start, end and step of a range query's values as
// name, value pairs for withQuery.
func rangePairs(v url.Values) []string {
	return []string{"start", v.Get("start"), "end", v.Get("end"), "step", v.Get("step")}
}

// dashboardSection is the report of the fleet dashboard.
func dashboardSection(cfg Config, qs []questionResult, caches string) section {
	dc := cfg.Dashboard
	wait := "the next refresh at once (the data is history: the window slides over the file's time, not the clock's)"
	if dc.Wait {
		wait = "10 s of wall time from one refresh to the next"
	}
	s := section{title: fmt.Sprintf("Fleet questions as a dashboard: %d refreshes, each every question as a range query over %s at step %s, the window sliding by %s per refresh and ending at the file's newest time at the last; %s; %s",
		dc.Refreshes, dc.Window, dc.Step, dashboardSlide, wait, caches),
		header: []string{"question", "telemetryd p50 / p99", "VictoriaMetrics p50 / p99", "p50 ratio", "p99 ratio", "first refresh (telemetryd, peer)", "series (telemetryd, peer)"}}
	for _, r := range qs {
		s.rows = append(s.rows, []string{r.Name, ms(r.Ours.P50) + " / " + ms(r.Ours.P99), ms(r.Peer.P50) + " / " + ms(r.Peer.P99),
			ratio(float64(r.Ours.P50), float64(r.Peer.P50)), ratio(float64(r.Ours.P99), float64(r.Peer.P99)),
			ms(r.OurFirst) + ", " + ms(r.PeerFirst), fmt.Sprintf("%d, %d", r.OurSeries, r.PeerSe)})
	}
	for _, r := range qs {
		if r.OurFailed+r.PeerFailed > 0 {
			s.notes = append(s.notes, fmt.Sprintf("%s: %d of telemetryd's and %d of the peer's answers were errors (timeouts); their times count", r.Name, r.OurFailed, r.PeerFailed))
		}
	}
	s.notes = append(s.notes, "Each refresh asks the seven questions of one service one at a time, then of the other (the order swapped every other refresh); the per-fleet questions ask of the East fleet. Start and end are aligned down to the step, as Grafana aligns them. Series: in the last refresh's answer. Load at the end: "+loadavg()+".")
	s.notes = append(s.notes, "The peer's series include those of lines that miss a tag (series of their own there); telemetryd's carry the truck's attributes.")
	if strings.Contains(caches, "nocache") {
		s.notes = append(s.notes, "The peer was asked with nocache=1.")
	}
	return s
}
