package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telemetryd/telemetryd/store/diskuse"
)

// The peer comparison (-peer-binary PATH -tsbs-file FILE) runs telemetryd
// and VictoriaMetrics one after the other on the same TSBS IoT file,
// each on a fresh directory, and prints each measure of both and their
// ratio:
//
//   - ingest: readings/s from the first request until every reading is
//     queryable. telemetryd is sent the file twice over: as line protocol
//     (POST /api/v2/write, -line-device-tags name) and as JSON messages of
//     100 readings on JetStream; the peer as line protocol on
//     /influx/write. Line protocol goes in requests of 10,000 lines, two
//     in flight. telemetryd answers a write once it is committed; the
//     peer answers once the rows are in its buffers, so it is polled
//     after its last answer until it counts every sample of two values
//     that nearly every line carries;
//   - latest value right after ingest: a random truck's latest reading,
//     one request at a time (telemetryd: GET
//     /v1/devices/{truck}/readings/latest?limit=1; the peer: the instant
//     query {name="truck"} at the file's newest time, its cache off);
//   - peak RSS (VmHWM) at the end of those, and bytes on disk per field
//     value after a clean stop (telemetryd: the data directory without
//     the embedded NATS server's files; the peer: its storage directory);
//   - the fleet questions (peerquestions.go), when telemetryd has device
//     attributes: both services restarted on the line protocol run's
//     data, once idle, asked as a dashboard (peerdashboard.go) and then
//     every question sent to both in turn at the file's newest time,
//     the caches as -fleet-caches says.
//
// With -repeat N the three ingest runs are done N times (every other
// round in reverse order) and the table shows medians.

// peerKinds are the ingest runs a round may do, in order: "line-B" and
// "json-B" are the line protocol and JSON runs of the -compare build.
var peerKinds = []string{"line", "json", "peer", "line-B", "json-B"}

// peerKindNames name the runs in the report.
var peerKindNames = map[string]string{
	"line":   "telemetryd, line protocol",
	"json":   "telemetryd, JSON 100/msg",
	"peer":   "VictoriaMetrics",
	"line-B": "telemetryd B, line protocol",
	"json-B": "telemetryd B, JSON 100/msg",
}

// isJSONRun tells the runs that publish JSON messages on JetStream.
func isJSONRun(kind string) bool { return kind == "json" || kind == "json-B" }

// isBRun tells the runs of the -compare build.
func isBRun(kind string) bool { return strings.HasSuffix(kind, "-B") }

// peerRun is what one ingest run measured.
type peerRun struct {
	Kind     string
	Rate     float64 // readings/s until queryable
	Accepted float64 // readings/s until the last write was answered (204, JetStream ack)
	Elapsed  time.Duration
	Latest   latency
	PeakRSS  int64
	Disk     int64
}

// questionResult is one fleet question on both services.
type questionResult struct {
	Name                  string
	Ours, Peer            latency
	OurSeries, PeerSe     int           // series in the first answer
	OurFirst, PeerFirst   time.Duration // the first ask
	OurFailed, PeerFailed int           // asks answered with an error (the dashboard's)
	Query, PeerQuery      string
}

// runPeer runs the peer comparison and prints its report to stdout.
func runPeer(ctx context.Context, cfg Config, stdout, progressOut io.Writer) error {
	work, err := os.MkdirTemp(cfg.WorkDir, "telemetry-peer-")
	if err != nil {
		return err
	}
	defer removeAll(work, cfg.Keep)
	b := &bench{cfg: cfg, prog: newProgress(progressOut, cfg.Progress), work: work, bin: cfg.Binary}
	if err := b.ensureBinary(ctx); err != nil {
		return err
	}
	attrs, err := b.probeAttributes(ctx, filepath.Join(work, "probe"))
	if err != nil {
		return err
	}
	removeAll(filepath.Join(work, "probe"), cfg.Keep)
	ph := b.prog.begin("peer: read "+cfg.TSBSFile, 0, "messages")
	d, err := loadPeerData(cfg.TSBSFile, time.Now(), attrs, ph)
	if err != nil {
		return err
	}
	debug.FreeOSMemory()
	ph.end(fmt.Sprintf("%d readings, %d field values, %d lines in %d requests (%d lines without a name left out), %d trucks, newest %s",
		d.json.readings, d.json.values, d.lines, len(d.bodies), d.dropped, len(d.trucks), d.end.Format(time.RFC3339)))
	var runs []peerRun
	keep := map[string]string{} // the last round's data dirs of the line and peer runs
	for rep := range cfg.Repeat {
		kinds := slices.Clone(cfg.PeerRuns)
		if rep%2 == 1 {
			slices.Reverse(kinds)
		}
		for _, kind := range kinds {
			dir := filepath.Join(work, fmt.Sprintf("%s-%d", kind, rep+1))
			r, err := b.peerOnce(ctx, kind, dir, d)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", peerKindNames[kind], rep+1, err)
			}
			runs = append(runs, r)
			if !isJSONRun(kind) && rep == cfg.Repeat-1 {
				keep[kind] = dir
			} else {
				removeAll(dir, cfg.Keep)
			}
		}
	}
	var qs, dash []questionResult
	if (cfg.FleetQueries > 0 || cfg.Dashboard.Refreshes > 0) && attrs && keep["line"] != "" && keep["peer"] != "" {
		if qs, dash, err = b.peerQuestions(ctx, keep["line"], keep["peer"], d); err != nil {
			return fmt.Errorf("fleet questions: %w", err)
		}
	}
	fmt.Fprint(stdout, peerReport(cfg, d, runs, qs, dash, attrs))
	return nil
}

// telemetrydFor is the telemetryd bin on dir for the peer comparison.
// Its line protocol names are <measurement>.<field> (telemetrydDialect),
// as builds before -line-name-separator named them.
func (b *bench) telemetrydFor(bin, dir string) *service {
	args := []string{"-line-device-tags", "name", "-http-rate", "0"}
	if hasFlag(bin, "line-name-separator") {
		args = append(args, "-line-name-separator", ".")
	}
	return &service{bin: bin, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "telemetryd.log"),
		telemetry: true, args: args}
}

// peerOnce is one ingest run of kind on a fresh dir.
func (b *bench) peerOnce(ctx context.Context, kind, dir string, d *peerData) (peerRun, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return peerRun{}, err
	}
	res := peerRun{Kind: kind}
	ph := b.prog.begin(peerKindNames[kind]+": ingest until queryable", d.json.readings, "readings")
	defer ph.end("")
	if kind == "peer" {
		p := &peerService{bin: b.cfg.PeerBinary, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "peer.log")}
		if err := p.start(ctx); err != nil {
			return res, err
		}
		defer p.stop(time.Minute)
		start := time.Now()
		if err := postBodies(ctx, p.client, p.url("/influx/write"), d.bodies); err != nil {
			return res, err
		}
		res.Accepted = float64(d.json.readings) / time.Since(start).Seconds()
		if err := waitPeerQueryable(ctx, p, d); err != nil {
			return res, err
		}
		res.Elapsed = time.Since(start)
		ph.set(int64(d.json.readings))
		rng := rand.New(rand.NewPCG(5, 5))
		lat, err := timeLatest(ctx, p.client, b.cfg.Queries, func() string {
			q := url.Values{"query": {fmt.Sprintf("{name=%q}", d.trucks[rng.IntN(len(d.trucks))])},
				"time": {promTime(d.end)}, "nocache": {"1"}}
			return p.url("/api/v1/query?" + q.Encode())
		})
		if err != nil {
			return res, err
		}
		res.Latest = lat
		st, err := p.stats()
		if err != nil {
			return res, err
		}
		res.PeakRSS = st.hwm
		if err := p.stop(time.Minute); err != nil {
			return res, err
		}
		res.Disk = diskuse.Tree(p.dataDir)
	} else {
		bin := b.bin
		if isBRun(kind) {
			bin = b.cfg.Compare
		}
		svc := b.telemetrydFor(bin, dir)
		if b.cfg.ProfileDir != "" {
			addr, err := freeAddr()
			if err != nil {
				return res, err
			}
			svc.pprofAddr = addr
		}
		if err := svc.start(ctx); err != nil {
			return res, err
		}
		defer svc.stop(time.Minute)
		stopProfile := b.profile(ctx, svc, "peer-"+filepath.Base(dir))
		defer stopProfile()
		stopHeap := b.heapAtPeak(ctx, svc, "peer-"+filepath.Base(dir))
		defer stopHeap()
		start := time.Now()
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		waited := make(chan error, 1)
		go func() { waited <- waitStored(wctx, svc, int64(d.json.readings), ph, 50*time.Millisecond) }()
		var err error
		if !isJSONRun(kind) {
			err = postBodies(ctx, svc.client, svc.url("/api/v2/write?bucket=tsbs&precision=ns"), d.bodies)
		} else {
			var nc *nats.Conn
			if nc, err = nats.Connect(svc.natsURL()); err == nil {
				_, err = publishAll(ctx, nc, d.json, nil)
				nc.Close()
			}
		}
		res.Accepted = float64(d.json.readings) / time.Since(start).Seconds()
		if err != nil {
			cancel()
			<-waited
			return res, err
		}
		if err := <-waited; err != nil {
			return res, err
		}
		res.Elapsed = time.Since(start)
		rng := rand.New(rand.NewPCG(5, 5))
		stopTrace := b.traceFor(ctx, svc, "peer-"+filepath.Base(dir)+".latest", 2*time.Second)
		lat, err := timeLatest(ctx, svc.client, b.cfg.Queries, func() string {
			return svc.url("/v1/devices/" + d.trucks[rng.IntN(len(d.trucks))] + "/readings/latest?limit=1")
		})
		stopTrace()
		if err != nil {
			return res, err
		}
		res.Latest = lat
		st, err := svc.stats()
		if err != nil {
			return res, err
		}
		res.PeakRSS = st.hwm
		if err := svc.stop(time.Minute); err != nil {
			return res, err
		}
		res.Disk = diskuse.Tree(svc.dataDir) - diskuse.Tree(filepath.Join(svc.dataDir, "nats"))
	}
	res.Rate = float64(d.json.readings) / res.Elapsed.Seconds()
	ph.end(fmt.Sprintf("%s readings/s (writes answered at %s/s); latest p50 %s, p99 %s; peak RSS %s; %.3f B per value",
		num(res.Rate), num(res.Accepted), ms(res.Latest.P50), ms(res.Latest.P99), mib(res.PeakRSS), float64(res.Disk)/float64(d.json.values)))
	return res, nil
}

// promTime is t as a Prometheus API time (seconds, millisecond
// fraction).
func promTime(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)
}

// postBodies posts every body to u, two requests in flight, and
// requires a 2xx answer to each.
func postBodies(ctx context.Context, client *http.Client, u string, bodies [][]byte) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, connectLineWriters)
	for w := range connectLineWriters {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(bodies) || ctx.Err() != nil {
					return
				}
				if err := postOK(ctx, client, u, bodies[i]); err != nil {
					errs[w] = fmt.Errorf("request %d: %w", i, err)
					next.Store(int64(len(bodies))) // stop the other writer
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// postOK posts body to u and requires a 2xx answer.
func postOK(ctx context.Context, client *http.Client, u string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", resp.Status, msg)
	}
	return nil
}

// waitPeerQueryable polls the peer until it counts as many samples of
// readings' velocity and diagnostics' status as the file has. Each poll
// carries a matcher of its own (name!="poll-N", true of every series):
// the peer caches the series a set of matchers selects, and polling
// with the same query while the series are still being registered
// would keep the early, empty answer for seconds.
func waitPeerQueryable(ctx context.Context, p *peerService, d *peerData) error {
	want := float64(d.velocity + d.status)
	deadline := time.Now().Add(30 * time.Minute)
	for i := 0; time.Now().Before(deadline); i++ {
		q := url.Values{"query": {fmt.Sprintf(`sum(count_over_time(readings_velocity{name!="poll-%d"}[2d])) + sum(count_over_time(diagnostics_status{name!="poll-%d"}[2d]))`, i, i)},
			"nocache": {"1"}}
		var got float64
		if r, err := promInstant(ctx, p.client, p.url("/api/v1/query?"+q.Encode())); err != nil {
			return err
		} else if len(r) == 1 {
			got = r[0]
		}
		if got >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("the peer did not count %.0f samples within 30 minutes", want)
}

// promInstant runs an instant query and returns the values of its
// vector.
func promInstant(ctx context.Context, client *http.Client, u string) ([]float64, error) {
	body, err := getBody(ctx, client, u)
	if err != nil {
		return nil, err
	}
	var r struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	var out []float64
	for _, s := range r.Data.Result {
		str, _ := s.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("GET %s: value %v: %w", u, s.Value[1], err)
		}
		out = append(out, v)
	}
	return out, nil
}

// getBody GETs u and returns the body of a 200 answer.
func getBody(ctx context.Context, client *http.Client, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.300s", u, resp.Status, body)
	}
	return body, nil
}

// timeLatest times n GETs of next(), one at a time.
func timeLatest(ctx context.Context, client *http.Client, n int, next func() string) (latency, error) {
	ds := make([]time.Duration, 0, n)
	for range n {
		u := next()
		start := time.Now()
		if _, err := getBody(ctx, client, u); err != nil {
			return latency{}, err
		}
		ds = append(ds, time.Since(start))
	}
	return summarize(ds), nil
}

// probeAttributes tells whether the telemetryd under test turns line
// protocol tags into device attributes: it writes one TSBS-like line to
// a fresh service on dir and reads the device back.
func (b *bench) probeAttributes(ctx context.Context, dir string) (bool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	svc := b.telemetrydFor(b.bin, dir)
	if err := svc.start(ctx); err != nil {
		return false, err
	}
	defer svc.stop(time.Minute)
	line := fmt.Sprintf("readings,name=probe,fleet=East velocity=1 %d\n", time.Now().Add(-time.Minute).UnixNano())
	if err := postOK(ctx, svc.client, svc.url("/api/v2/write?bucket=probe&precision=ns"), []byte(line)); err != nil {
		return false, fmt.Errorf("probe: %w", err)
	}
	for range 100 {
		// Stored first: a message's attributes are committed before
		// its readings.
		if n, err := svc.stored(ctx); err == nil && n > 0 {
			var dev struct {
				Attributes map[string]string `json:"attributes"`
			}
			err := svc.getJSON(ctx, "/v1/devices/probe", &dev)
			return err == nil && dev.Attributes["fleet"] == "East", nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return false, err
		}
	}
	return false, nil
}
