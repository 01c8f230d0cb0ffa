package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// peerQuestions restarts telemetryd on lineDir and the peer on peerDir,
// waits until both are idle, asks the fleet dashboard of
// cfg.Dashboard (peerDashboard), and then sends every fleet question
// to both in turn, cfg.FleetQueries times each (the order swapped every
// other time, the fleet going round tsbsFleets), at the file's newest
// time. With -profile-dir, telemetryd's CPU profile of the first
// -profile-seconds of each question is saved as fleet-<question>.pprof.
func (b *bench) peerQuestions(ctx context.Context, lineDir, peerDir string, d *peerData) (instant, dash []questionResult, _ error) {
	svc := b.telemetrydFor(b.bin, lineDir)
	peerQuery := url.Values{}
	if b.cfg.FleetCaches != "on" {
		peerQuery.Set("nocache", "1")
	}
	if b.cfg.FleetCaches == "off" {
		svc.args = append(svc.args, "-column-cache=false")
	}
	if b.cfg.ProfileDir != "" {
		addr, err := freeAddr()
		if err != nil {
			return nil, nil, err
		}
		svc.pprofAddr = addr
	}
	if err := svc.start(ctx); err != nil {
		return nil, nil, err
	}
	defer svc.stop(time.Minute)
	p := &peerService{bin: b.cfg.PeerBinary, dataDir: filepath.Join(peerDir, "data"), logPath: filepath.Join(peerDir, "peer.log")}
	if err := p.start(ctx); err != nil {
		return nil, nil, err
	}
	defer p.stop(time.Minute)
	ph := b.prog.begin("fleet questions: wait for both to go idle", 0, "")
	if _, err := waitIdle(ctx, svc, 0.05, 3*time.Minute); err != nil {
		return nil, nil, err
	}
	if _, err := waitIdleProc(ctx, p.stats, 0.05, 3*time.Minute); err != nil {
		return nil, nil, err
	}
	ph.end("")
	if b.cfg.Dashboard.Refreshes > 0 {
		var err error
		if dash, err = b.peerDashboard(ctx, svc, p, peerQuery, d); err != nil {
			return nil, nil, err
		}
	}
	if b.cfg.FleetQueries == 0 {
		return nil, dash, nil
	}
	at := promTime(d.end)
	var out []questionResult
	for _, q := range fleetQuestions("6h") {
		ph := b.prog.begin("fleet question: "+q.Name, 2*b.cfg.FleetQueries, "queries")
		r := questionResult{Name: q.Name, Query: q.Query(telemetrydDialect, "East"), PeerQuery: q.Query(peerDialect, "East")}
		var ours, peer []time.Duration
		stopProfile := b.profile(ctx, svc, "fleet-"+sanitize(q.Name))
		for i := range b.cfg.FleetQueries {
			fleet := tsbsFleets[i%len(tsbsFleets)]
			sides := []struct {
				client *http.Client
				u      string
				ds     *[]time.Duration
				series *int
			}{
				{svc.client, svc.url("/api/v1/query?" + url.Values{"query": {q.Query(telemetrydDialect, fleet)}, "time": {at}}.Encode()), &ours, &r.OurSeries},
				{p.client, p.url("/api/v1/query?" + withQuery(peerQuery, "query", q.Query(peerDialect, fleet), "time", at).Encode()), &peer, &r.PeerSe},
			}
			if i%2 == 1 {
				sides[0], sides[1] = sides[1], sides[0]
			}
			for _, s := range sides {
				start := time.Now()
				body, err := getBody(ctx, s.client, s.u)
				if err != nil {
					return nil, nil, err
				}
				*s.ds = append(*s.ds, time.Since(start))
				if i == 0 {
					*s.series = countSeries(body)
				}
				ph.add(1)
			}
		}
		stopProfile()
		r.Ours, r.Peer = summarize(ours), summarize(peer)
		if len(ours) > 0 {
			r.OurFirst, r.PeerFirst = ours[0], peer[0]
		}
		ph.end(fmt.Sprintf("p50 %s against %s", ms(r.Ours.P50), ms(r.Peer.P50)))
		out = append(out, r)
	}
	return out, dash, nil
}

// withQuery is a copy of base with the pairs kv (name, value, ...) set.
func withQuery(base url.Values, kv ...string) url.Values {
	v := url.Values{}
	for k, vs := range base {
		v[k] = slices.Clone(vs)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

// waitIdleProc is waitIdle for any process whose stats reads /proc.
func waitIdleProc(ctx context.Context, stats func() (procStats, error), cores float64, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	prev, err := stats()
	if err != nil {
		return 0, err
	}
	for time.Since(start) < limit {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Second):
		}
		st, err := stats()
		if err != nil {
			return 0, err
		}
		if (st.cpu - prev.cpu).Seconds() < cores {
			break
		}
		prev = st
	}
	return time.Since(start), nil
}

// countSeries is the number of series in a Prometheus query answer (-1
// if it is not one).
func countSeries(body []byte) int {
	var r struct {
		Data struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &r) != nil {
		return -1
	}
	return len(r.Data.Result)
}

// peerReport renders the comparison: the median of each measure per
// run kind, and telemetryd's figures over the peer's.
func peerReport(cfg Config, d *peerData, runs []peerRun, qs, dash []questionResult, attrs bool) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "telemetryd: %s\npeer: %s\nfile: %s: %s readings (lines of a truck and time merged), %s field values, %s lines (%d without a name left out); times moved by %s\nload at the end: %s\n\n",
		cfg.Binary, cfg.PeerBinary, d.file, num(float64(d.json.readings)), num(float64(d.json.values)), num(float64(d.lines)), d.dropped, d.shift, loadavg())
	by := map[string][]peerRun{}
	for _, r := range runs {
		by[r.Kind] = append(by[r.Kind], r)
	}
	med := func(kind string, f func(peerRun) float64) float64 { return medianBy(by[kind], f) }
	rate := func(r peerRun) float64 { return r.Rate }
	disk := func(r peerRun) float64 { return float64(r.Disk) / float64(d.json.values) }
	p50 := func(r peerRun) float64 { return float64(r.Latest.P50) }
	p99 := func(r peerRun) float64 { return float64(r.Latest.P99) }
	rss := func(r peerRun) float64 { return float64(r.PeakRSS) }
	s := section{title: fmt.Sprintf("telemetryd against VictoriaMetrics on one TSBS IoT file (median of %d runs each)", cfg.Repeat),
		header: []string{"measure"}}
	type ratioCol struct{ num, den string }
	var ratios []ratioCol
	for _, kind := range cfg.PeerRuns {
		s.header = append(s.header, peerKindNames[kind])
	}
	for _, kind := range cfg.PeerRuns {
		switch {
		case isBRun(kind) && slices.Contains(cfg.PeerRuns, strings.TrimSuffix(kind, "-B")):
			a := strings.TrimSuffix(kind, "-B")
			ratios = append(ratios, ratioCol{kind, a})
			s.header = append(s.header, strings.Replace(a, "json", "JSON", 1)+" B / "+strings.Replace(a, "json", "JSON", 1)+" A")
		case kind != "peer" && !isBRun(kind) && slices.Contains(cfg.PeerRuns, "peer"):
			ratios = append(ratios, ratioCol{kind, "peer"})
			s.header = append(s.header, strings.Replace(kind, "json", "JSON", 1)+" / peer")
		}
	}
	row := func(name string, f func(peerRun) float64, format func(float64) string) {
		r := []string{name}
		for _, kind := range cfg.PeerRuns {
			r = append(r, format(med(kind, f)))
		}
		for _, c := range ratios {
			r = append(r, ratio(med(c.num, f), med(c.den, f)))
		}
		s.rows = append(s.rows, r)
	}
	row("ingest, readings/s until queryable", rate, num)
	row("ingest, readings/s until the last write was answered", func(r peerRun) float64 { return r.Accepted }, num)
	row("disk per value after a clean stop", disk, func(v float64) string { return fmt.Sprintf("%.3f B", v) })
	row("latest value right after ingest, p50", p50, func(v float64) string { return ms(time.Duration(v)) })
	row("latest value right after ingest, p99", p99, func(v float64) string { return ms(time.Duration(v)) })
	row("peak RSS", rss, func(v float64) string { return mib(int64(v)) })
	if cfg.Repeat > 1 {
		for _, kind := range cfg.PeerRuns {
			var all []string
			for _, r := range by[kind] {
				all = append(all, num(r.Rate))
			}
			s.notes = append(s.notes, fmt.Sprintf("%s, readings/s of each run: %s", peerKindNames[kind], strings.Join(all, ", ")))
		}
	}
	if slices.Contains(cfg.PeerRuns, "line-B") {
		s.notes = append(s.notes, "B = "+cfg.Compare)
	}
	if slices.Contains(cfg.PeerRuns, "peer") {
		s.notes = append(s.notes, "Ratios are telemetryd over the peer: above 1 is better for readings/s, worse for the others.")
	}
	sections := []section{s}
	caches := "both services' query caches as shipped: telemetryd's column cache, the peer's rollup result cache"
	switch cfg.FleetCaches {
	case "off":
		caches = "both services' query caches off: telemetryd -column-cache=false, the peer asked with nocache=1"
	case "ours":
		caches = "telemetryd's column cache on, the peer's rollup result cache off (nocache=1)"
	}
	if len(dash) > 0 {
		sections = append(sections, dashboardSection(cfg, dash, caches))
	}
	switch {
	case len(qs) > 0:
		q := section{title: fmt.Sprintf("Fleet questions as PromQL, instant queries at the file's newest time (%d of each on both, alternating; %s)", cfg.FleetQueries, caches),
			header: []string{"question", "telemetryd p50 / p99", "VictoriaMetrics p50 / p99", "p50 ratio", "p99 ratio", "first ask (telemetryd, peer)", "series (telemetryd, peer)"}}
		for _, r := range qs {
			q.rows = append(q.rows, []string{r.Name, ms(r.Ours.P50) + " / " + ms(r.Ours.P99), ms(r.Peer.P50) + " / " + ms(r.Peer.P99),
				ratio(float64(r.Ours.P50), float64(r.Peer.P50)), ratio(float64(r.Ours.P99), float64(r.Peer.P99)),
				ms(r.OurFirst) + ", " + ms(r.PeerFirst), fmt.Sprintf("%d, %d", r.OurSeries, r.PeerSe)})
		}
		q.notes = append(q.notes, "First ask: the first query of the question, telemetryd's asked first (each question's first ask meets caches that hold none of its columns; the fleet goes round East, West, North, South).")
		for _, r := range qs {
			q.notes = append(q.notes, fmt.Sprintf("%s: `%s`; the peer: `%s`", r.Name, r.Query, r.PeerQuery))
		}
		q.notes = append(q.notes, "The peer's series include those of lines that miss a tag (a series of their own there, whose latest value may be hours old, so its answers to the questions on latest values hold more series); telemetryd's carry the truck's attributes.")
		sections = append(sections, q)
	case !attrs:
		sections[0].notes = append(sections[0].notes, "Fleet questions not asked: this telemetryd does not turn line protocol tags into device attributes.")
	}
	return sb.String() + report{sections: sections}.text()
}
