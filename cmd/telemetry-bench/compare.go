package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// -compare: two builds of telemetryd side by side. Measuring one build
// after the other on a shared machine mixes the difference between the
// builds with the machine's drift between the runs (at an idle latest-10
// of 0.3 ms, runs of the same binary differ by 10-15%). Here both
// services run at once on identical data and every query goes to both,
// one right after the other (the order swapped every pair), so drift
// hits both alike and the ratio shows the builds alone.

// compareSide is one build in a comparison.
type compareSide struct {
	name           string
	svc            *service
	latest, hour   []time.Duration
	latestP, hourP []latency // per round
}

// runCompare measures cfg.Binary (A) against other (B); see above. It
// publishes cfg.QueryReadings readings over cfg.Devices devices (100 per
// message, one per second per device) to each service through its NATS
// server, waits until both stored them and went idle, then runs
// cfg.Repeat rounds of cfg.Queries latest-10 pairs and as many 1-hour
// range pairs.
func runCompare(ctx context.Context, cfg Config, other string, stdout, progressOut io.Writer) error {
	if cfg.Binary == "" {
		return fmt.Errorf("-compare needs -binary (the build to compare against)")
	}
	work, err := os.MkdirTemp(cfg.WorkDir, "telemetry-compare-")
	if err != nil {
		return err
	}
	defer removeAll(work, cfg.Keep)
	prog := newProgress(progressOut, cfg.Progress)
	w := workload{devices: deviceIDs(cfg.Devices), perMsg: 100, msgs: max(1, cfg.QueryReadings/100),
		step: time.Second, base: dayStart(time.Now()).Add(-23 * time.Hour)}
	if w.span() > 22*time.Hour {
		return fmt.Errorf("-query-readings %d over %d devices is more than a day at one reading per second", cfg.QueryReadings, cfg.Devices)
	}
	rangeN := min(int(rangeSpan/w.step), w.perDevice())
	sides := []*compareSide{{name: "A"}, {name: "B"}}
	for i, bin := range []string{cfg.Binary, other} {
		svc, err := startFilled(ctx, bin, filepath.Join(work, sides[i].name), w, prog)
		if err != nil {
			return fmt.Errorf("%s (%s): %w", sides[i].name, bin, err)
		}
		defer svc.stop(30 * time.Second)
		sides[i].svc = svc
	}
	for _, s := range sides {
		ph := prog.begin("wait for "+s.name+" to go idle", 0, "")
		settle, err := waitIdle(ctx, s.svc, 0.05, 3*time.Minute)
		if err != nil {
			return err
		}
		ph.end(settle.Round(time.Second).String())
	}
	rng := rand.New(rand.NewPCG(3, 3))
	q := &querier{w: w, rangeN: rangeN, rng: rng}
	for round := range max(1, cfg.Repeat) {
		ph := prog.begin(fmt.Sprintf("round %d: latest-10 and 1-hour range pairs", round+1), 2*cfg.Queries, "pairs")
		for i := range 2 * cfg.Queries {
			path, hour := comparePath(q, i)
			if err := queryPair(ctx, sides, path, hour, i%4 >= 2); err != nil {
				return err
			}
			ph.add(1)
		}
		ph.end("")
		for _, s := range sides {
			s.latestP = append(s.latestP, summarize(s.latest))
			s.hourP = append(s.hourP, summarize(s.hour))
			s.latest, s.hour = s.latest[:0], s.hour[:0]
		}
	}
	fmt.Fprint(stdout, compareReport(cfg, other, w, rangeN, sides))
	return nil
}

// comparePath is the i-th query of a round: latest-10 and a 1-hour range
// alternate.
func comparePath(q *querier, i int) (path string, hour bool) {
	if i%2 == 1 {
		return q.hourPath(), true
	}
	dev := q.w.devices[q.rng.IntN(len(q.w.devices))]
	return "/v1/devices/" + string(dev) + "/readings/latest?limit=" + strconv.Itoa(latestN), false
}

// queryPair sends path to both sides, B first when swap is set, and
// records how long each took.
func queryPair(ctx context.Context, sides []*compareSide, path string, hour, swap bool) error {
	order := []*compareSide{sides[0], sides[1]}
	if swap {
		order[0], order[1] = order[1], order[0]
	}
	for _, s := range order {
		q := &querier{svc: s.svc}
		start := time.Now()
		if _, err := q.get(ctx, path, false); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		d := time.Since(start)
		if hour {
			s.hour = append(s.hour, d)
		} else {
			s.latest = append(s.latest, d)
		}
	}
	return nil
}

// startFilled starts bin on a fresh data dir under dir, publishes w to
// it and waits until every reading is stored.
func startFilled(ctx context.Context, bin, dir string, w workload, prog *progress) (*service, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	svc := &service{bin: bin, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "telemetryd.log"),
		telemetry: true, noMQTT: !hasFlag(bin, "mqtt-listen")}
	if hasFlag(bin, "http-rate") {
		// Every query of both sides comes from this one address, at
		// several thousand a second: past -http-rate they would be
		// answered 429 instead of measured.
		svc.args = append(svc.args, "-http-rate", "0")
	}
	if err := svc.start(ctx); err != nil {
		return nil, err
	}
	nc, err := nats.Connect(svc.natsURL())
	if err != nil {
		_ = svc.stop(30 * time.Second)
		return nil, err
	}
	defer nc.Close()
	ph := prog.begin("publish and store "+filepath.Base(bin), w.readings(), "readings")
	if _, err = publishAll(ctx, nc, w, nil); err == nil {
		err = waitStored(ctx, svc, int64(w.readings()), ph, 100*time.Millisecond)
	}
	if err != nil {
		_ = svc.stop(30 * time.Second)
		return nil, err
	}
	ph.end("")
	return svc, nil
}

// hasFlag reports whether bin's -h lists -name (older builds lack some
// of today's flags).
func hasFlag(bin, name string) bool {
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	return strings.Contains(string(out), "-"+name+" ")
}

// compareReport prints each round's p50 and p99 of both sides and their
// ratios, and the median of the ratios over the rounds.
func compareReport(cfg Config, other string, w workload, rangeN int, sides []*compareSide) string {
	var b strings.Builder
	fmt.Fprintf(&b, "A = %s\nB = %s\n%d readings over %d devices; %d pairs of each query per round, alternating A and B; load %s\n\n",
		cfg.Binary, other, w.readings(), len(w.devices), cfg.Queries, loadavg())
	fmt.Fprintf(&b, "%-6s  %-34s  %-34s\n", "round", "latest-10 p50 / p99 (A, B, B/A)", fmt.Sprintf("%d-reading range p50 / p99 (A, B, B/A)", rangeN))
	a, bb := sides[0], sides[1]
	var r50, r99, h50, h99 []float64
	for i := range a.latestP {
		r50 = append(r50, ratioOf(bb.latestP[i].P50, a.latestP[i].P50))
		r99 = append(r99, ratioOf(bb.latestP[i].P99, a.latestP[i].P99))
		h50 = append(h50, ratioOf(bb.hourP[i].P50, a.hourP[i].P50))
		h99 = append(h99, ratioOf(bb.hourP[i].P99, a.hourP[i].P99))
		fmt.Fprintf(&b, "%-6d  %s %s %.3f / %s %s %.3f    %s %s %.3f / %s %s %.3f\n", i+1,
			ms(a.latestP[i].P50), ms(bb.latestP[i].P50), r50[i], ms(a.latestP[i].P99), ms(bb.latestP[i].P99), r99[i],
			ms(a.hourP[i].P50), ms(bb.hourP[i].P50), h50[i], ms(a.hourP[i].P99), ms(bb.hourP[i].P99), h99[i])
	}
	fmt.Fprintf(&b, "median B/A over %d rounds: latest-10 p50 %.3f, p99 %.3f; range p50 %.3f, p99 %.3f\n",
		len(r50), median(r50), median(r99), median(h50), median(h99))
	return b.String()
}

func ratioOf(b, a time.Duration) float64 {
	if a <= 0 {
		return 0
	}
	return float64(b) / float64(a)
}

// median is the middle of xs (the mean of the middle two when even).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
