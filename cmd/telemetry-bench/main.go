// Command telemetry-bench measures the telemetry service against the
// ceilings of what it is built on, in one run on one machine, and
// prints a table with the ratios (as markdown too, with -out FILE).
//
// It measures, each on a fresh temporary directory:
//
//   - raw ceilings: Badger WriteBatches of one entry per reading (the
//     layout before blocks: device and inverted ticks as the key, the
//     values as the value), on a DB with the store's hot table options,
//     the baseline the store's blocks are measured against; and
//     JetStream alone (in-process server, file storage) publishing and
//     consuming-and-acking the same payloads without processing them;
//   - the store's own write path (store.Write in batches of 5,000);
//   - end to end against the real telemetryd binary, built with go build
//     and started as a child process with its embedded NATS server: from
//     the first publish until GET /v1/tables counts every reading, at 1,
//     100 and 10,000 readings per message, with telemetry on and off
//     (OTEL_SDK_DISABLED=true) and with -sync-writes, with the service's
//     CPU time (from /proc/<pid>/stat) and peak RSS (VmHWM);
//   - queries: readings prefilled through store.Write (one per second
//     per device), latest-10 and a one-hour range as Badger prefix seeks
//     on a copy of the same readings written one entry per reading, then
//     over HTTP from the service
//     started on the data, idle and under full-speed ingest (p50, p99);
//   - bytes on disk per reading, as written and after a Badger Flatten.
//
// Usage:
//
//	telemetry-bench -out run.md                     full run (about 14 minutes on 2 cores)
//	telemetry-bench -quick                          about 1-2 minutes
//	telemetry-bench -phases e2e -readings 200000    one part, scaled down
//	telemetry-bench -binary A -compare B -quick     two builds' queries side by side
//	telemetry-bench -phases tsbs -tsbs FILE -compare OLD -binary NEW
//	telemetry-bench -peer-binary victoria-metrics -tsbs-file FILE -binary NEW
//	                                                telemetryd against VictoriaMetrics on a TSBS IoT file (peer.go)
//	telemetry-bench -fsync-files 1,8,16,32          fsyncs/s with files written at once (fsync.go)
//	telemetry-bench -match-devices 100000 -binary NEW
//	                                                the device list filtered by attribute (matchdevices.go)
//	                                                a TSBS IoT file end to end, two builds alternately
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Config is one benchmark run.
type Config struct {
	Readings       int      // readings per ingest measurement (each raw ceiling, store write, each end-to-end run)
	Devices        int      // devices the readings are spread over
	QueryReadings  int      // readings prefilled for the query measurement
	Queries        int      // requests per latency figure
	Repeat         int      // runs of each repeated end-to-end configuration
	PacedRates     []int    // after full speed, measure the loaded queries again with ingest paced at these readings/s
	Phases         []string // which parts to run: raw, store, e2e, query
	Runs           []string // which end-to-end runs (names as in the report); empty: all
	Doors          []string // which doors the connect phase measures (line, mqtt), each with its baseline; empty: all
	Binary         string   // telemetryd binary; empty builds ./cmd/telemetryd
	WorkDir        string   // where data goes; empty: a temp dir, removed unless Keep
	Keep           bool     // keep WorkDir
	TSBSFile       string   // -tsbs: the TSBS IoT file of the tsbs phase; without that phase, measure the file's store writes instead of the run
	PeerBinary     string   // -peer-binary: VictoriaMetrics to compare with on TSBSFile, instead of the run
	FleetQueries   int      // with PeerBinary: times each fleet question is asked of each service (0: none)
	FleetCaches    string   // with PeerBinary: "on" (both services' query caches as shipped), "off" (both off) or "ours" (telemetryd's only)
	Dashboard      dashboardConfig
	PeerRuns       []string      // with PeerBinary: the ingest runs of each round (peerKinds)
	MatchDevices   int           // -match-devices: time the device list filtered by attribute over this many devices, instead of the run
	FsyncFiles     []int         // -fsync-files: instead of the run, fsyncs/s with this many files written at once (fsync.go)
	FsyncFor       time.Duration // -fsync-seconds: length of each fsync measurement
	Compare        string        // -compare: a second build (B) against Binary (A): its queries side by side instead of the run, or with the tsbs phase alternate runs of both
	Out            string        // also write the report as markdown here
	ProfileDir     string        // save a CPU profile of each end-to-end run's service here
	ProfileSeconds int           // length of each profile
	Progress       time.Duration // progress line interval
}

// allPhases are the parts of a run, in order.
// "connect" (the device doors: line protocol and MQTT against
// JetStream) and "tsbs" (a TSBS IoT file end to end) run only when
// asked for.
var allPhases = []string{"raw", "store", "e2e", "query", "connect", "tsbs"}

// DefaultConfig is the full run.
func DefaultConfig() Config {
	return Config{Readings: 3_000_000, Devices: 1000, QueryReadings: 10_000_000, Queries: 2000, Repeat: 3,
		PacedRates: []int{100_000, 200_000},
		Phases:     allPhases[:4], ProfileSeconds: 5, Progress: 5 * time.Second}
}

// QuickConfig is the scaled-down run of -quick.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Readings, c.QueryReadings, c.Queries, c.Repeat, c.Progress = 200_000, 1_000_000, 300, 1, 2*time.Second
	c.PacedRates = nil
	return c
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run parses args, runs the benchmark and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "telemetry-bench:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if len(cfg.FsyncFiles) > 0 {
		if err := runFsync(ctx, cfg, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "telemetry-bench:", err)
			return 1
		}
		return 0
	}
	if cfg.MatchDevices > 0 {
		if err := runMatchDevices(ctx, cfg, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "telemetry-bench:", err)
			return 1
		}
		return 0
	}
	if cfg.PeerBinary != "" {
		if err := runPeer(ctx, cfg, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "telemetry-bench:", err)
			return 1
		}
		return 0
	}
	if cfg.Compare != "" && !slices.Contains(cfg.Phases, "tsbs") {
		if err := runCompare(ctx, cfg, cfg.Compare, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "telemetry-bench:", err)
			return 1
		}
		return 0
	}
	if cfg.TSBSFile != "" && !slices.Contains(cfg.Phases, "tsbs") {
		if err := runTSBS(ctx, cfg, cfg.TSBSFile, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "telemetry-bench:", err)
			return 1
		}
		return 0
	}
	res, err := Run(ctx, cfg, stderr)
	if res != nil {
		report := buildReport(res)
		fmt.Fprint(stdout, report.text())
		if cfg.Out != "" {
			if werr := os.WriteFile(cfg.Out, []byte(report.markdown()), 0o644); werr != nil {
				fmt.Fprintln(stderr, "telemetry-bench: write -out:", werr)
				return 1
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "telemetry-bench:", err)
		return 1
	}
	return 0
}

// parseFlags reads the command line. -quick changes the defaults of the
// size flags; flags given explicitly win.
func parseFlags(args []string, out io.Writer) (Config, error) {
	fs := flag.NewFlagSet("telemetry-bench", flag.ContinueOnError)
	fs.SetOutput(out)
	cfg := DefaultConfig()
	quick := fs.Bool("quick", false, "scaled-down run of about 1-2 minutes (200k readings, 1M query readings, 300 queries, no repeats)")
	phases := fs.String("phases", strings.Join(allPhases[:4], ","), "parts to run, comma-separated: "+strings.Join(allPhases, ","))
	fs.IntVar(&cfg.Readings, "readings", cfg.Readings, "readings per ingest measurement (raw ceilings, store write, each end-to-end run)")
	fs.IntVar(&cfg.Devices, "devices", cfg.Devices, "devices the readings are spread over")
	fs.IntVar(&cfg.QueryReadings, "query-readings", cfg.QueryReadings, "readings prefilled for the query latencies")
	fs.IntVar(&cfg.Queries, "queries", cfg.Queries, "requests per latency figure")
	paced := fs.String("paced-rates", intList(cfg.PacedRates), "after the queries under full-speed ingest, measure them again with ingest paced at these readings/s (comma-separated; empty: none)")
	fs.IntVar(&cfg.Repeat, "repeat", cfg.Repeat, "runs of the end-to-end configurations compared with each other (telemetry on and off); the report shows the median")
	runs := fs.String("runs", "", "end-to-end runs to do, comma-separated names as in the report (default: all)")
	doors := fs.String("doors", "", "doors the connect phase measures, each against its baseline, comma-separated: line,mqtt,mqtt-paho,line-sync,mqtt-sync (mqtt-paho: MQTT published with paho's client; line-sync, mqtt-sync: with -sync-writes, against the same door without it) (default: all but line-sync and mqtt-sync)")
	fs.StringVar(&cfg.Binary, "binary", "", "telemetryd binary (default: go build ./cmd/telemetryd into the work dir)")
	fs.StringVar(&cfg.WorkDir, "work-dir", "", "directory for data (default: a temp dir, removed afterwards)")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the work dir")
	fs.StringVar(&cfg.TSBSFile, "tsbs", "", "a TSBS IoT influx file (tsbs_generate_data --use-case=iot --format=influx): with -phases tsbs, publish it to the service end to end at 100 readings per message; otherwise, instead of the run, store it as blocks and as one Badger entry per reading, and report write rates and bytes on disk")
	fs.StringVar(&cfg.TSBSFile, "tsbs-file", "", "the same as -tsbs")
	fs.StringVar(&cfg.PeerBinary, "peer-binary", "", "a VictoriaMetrics binary (single node, app/victoria-metrics): instead of the run, compare telemetryd (line protocol and JSON at 100 per message) with it on the -tsbs file, one after the other, -repeat times: ingest until queryable, disk per value, latest value right after ingest (-queries requests), peak RSS, and the fleet questions as PromQL when telemetryd has device attributes")
	peerRuns := fs.String("peer-runs", "line,json,peer", "with -peer-binary: the ingest runs of each round, comma-separated: line, json (telemetryd), peer (VictoriaMetrics), line-B and json-B (the -compare build through line protocol and JSON)")
	fs.IntVar(&cfg.FleetQueries, "fleet-queries", 20, "with -peer-binary: times each fleet question is asked of each service (0: none)")
	fs.IntVar(&cfg.Dashboard.Refreshes, "fleet-dashboard", 30, "with -peer-binary: refreshes of the fleet dashboard: each asks every fleet question of both services as a range query over -dashboard-window at -dashboard-step, the window sliding 10 s per refresh over the file's time (0: none)")
	fs.DurationVar(&cfg.Dashboard.Window, "dashboard-window", time.Hour, "with -fleet-dashboard: the time range of each refresh")
	fs.DurationVar(&cfg.Dashboard.Step, "dashboard-step", time.Minute, "with -fleet-dashboard: the step of its range queries")
	fs.BoolVar(&cfg.Dashboard.Wait, "dashboard-wait", false, "with -fleet-dashboard: wait 10 s of wall time from one refresh to the next (default: the next refresh follows at once)")
	fs.StringVar(&cfg.FleetCaches, "fleet-caches", "on", "with -peer-binary: the query caches of both services during the fleet questions: on (as shipped: telemetryd's column cache, the peer's rollup result cache), off (telemetryd -column-cache=false, the peer asked with nocache=1) or ours (telemetryd's column cache on, the peer asked with nocache=1)")
	fs.IntVar(&cfg.MatchDevices, "match-devices", 0, `instead of the run, send this many devices (one reading each) with attributes over 10 fleets and time GET /v1/devices?match={fleet="East"} (-queries requests per figure) against the unfiltered list`)
	fsyncFiles := fs.String("fsync-files", "", "instead of the run, measure the fsyncs/s of the work dir's file system with this many files written at once, each write followed by an fsync (comma-separated counts, e.g. 1,8,16,32)")
	fs.DurationVar(&cfg.FsyncFor, "fsync-seconds", 3*time.Second, "with -fsync-files: length of each measurement")
	fs.StringVar(&cfg.Compare, "compare", "", "a second telemetryd build (B) against -binary (A). Without -phases tsbs, instead of the run, start both side by side on the same readings (-query-readings over -devices) and send every latest-10 and 1-hour range query to both in turn (-queries pairs per round, -repeat rounds); prints p50/p99 of each and B/A. With -phases tsbs, run the TSBS file end to end on A and B alternately, A first, -repeat times each; prints B/A")
	fs.StringVar(&cfg.Out, "out", "", "also write the report as markdown to this file")
	fs.StringVar(&cfg.ProfileDir, "profile-dir", "", "save a CPU profile of the service during each end-to-end and connect run here (with -peer-binary: each telemetryd ingest run, with its heap profile at peak RSS and an execution trace and CPU profile of its latest-value requests (NAME.latest.trace, NAME.latest.pprof), and each fleet question)")
	fs.IntVar(&cfg.ProfileSeconds, "profile-seconds", cfg.ProfileSeconds, "length of each CPU profile")
	fs.DurationVar(&cfg.Progress, "progress", cfg.Progress, "progress line interval (0: off)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if *quick {
		applyQuick(fs, &cfg)
	}
	cfg.Phases = strings.Split(*phases, ",")
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["paced-rates"] || !*quick {
		rates, err := parseInts(*paced)
		if err != nil {
			return cfg, fmt.Errorf("-paced-rates: %w", err)
		}
		cfg.PacedRates = rates
	}
	if *runs != "" {
		cfg.Runs = strings.Split(*runs, ",")
	}
	cfg.PeerRuns = strings.Split(*peerRuns, ",")
	if *fsyncFiles != "" {
		n, err := parseInts(*fsyncFiles)
		if err != nil {
			return cfg, fmt.Errorf("-fsync-files: %w", err)
		}
		cfg.FsyncFiles = n
	}
	if *doors != "" {
		cfg.Doors = strings.Split(*doors, ",")
	}
	return cfg, cfg.validate()
}

// applyQuick sets the -quick sizes on every size flag not given.
func applyQuick(fs *flag.FlagSet, cfg *Config) {
	q := QuickConfig()
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["readings"] {
		cfg.Readings = q.Readings
	}
	if !set["query-readings"] {
		cfg.QueryReadings = q.QueryReadings
	}
	if !set["queries"] {
		cfg.Queries = q.Queries
	}
	if !set["repeat"] {
		cfg.Repeat = q.Repeat
	}
	if !set["progress"] {
		cfg.Progress = q.Progress
	}
	cfg.PacedRates = q.PacedRates
}

// validate reports the first setting that cannot work.
func (c Config) validate() error {
	for _, p := range c.Phases {
		if !slices.Contains(allPhases, p) {
			return fmt.Errorf("-phases: unknown part %q (want some of %s)", p, strings.Join(allPhases, ","))
		}
	}
	for _, r := range c.Runs {
		if !slices.ContainsFunc(e2eRuns(), func(e e2eRun) bool { return e.Name == r }) {
			return fmt.Errorf("-runs: unknown run %q", r)
		}
	}
	for _, d := range c.Doors {
		if !slices.ContainsFunc(connectRuns(), func(r connectRun) bool { return r.Door == d }) {
			return fmt.Errorf("-doors: unknown door %q (want line, mqtt or mqtt-paho)", d)
		}
	}
	tsbs := slices.Contains(c.Phases, "tsbs")
	switch {
	case c.PeerBinary != "" && c.TSBSFile == "":
		return errors.New("-peer-binary: want the TSBS IoT file in -tsbs-file FILE")
	case c.PeerBinary != "" && slices.ContainsFunc(c.PeerRuns, func(k string) bool { return !slices.Contains(peerKinds, k) }):
		return fmt.Errorf("-peer-runs %s: want some of %s", strings.Join(c.PeerRuns, ","), strings.Join(peerKinds, ","))
	case c.PeerBinary != "" && slices.ContainsFunc(c.PeerRuns, isBRun) && c.Compare == "":
		return errors.New("-peer-runs line-B, json-B: want the B build in -compare")
	case slices.ContainsFunc(c.FsyncFiles, func(n int) bool { return n < 1 || n > 1024 }):
		return fmt.Errorf("-fsync-files %v: want counts of 1 to 1024", c.FsyncFiles)
	case len(c.FsyncFiles) > 0 && c.FsyncFor <= 0:
		return fmt.Errorf("-fsync-seconds %s: want more than 0", c.FsyncFor)
	case c.MatchDevices < 0:
		return fmt.Errorf("-match-devices %d: want 0 or more", c.MatchDevices)
	case !slices.Contains([]string{"on", "off", "ours"}, c.FleetCaches):
		return fmt.Errorf("-fleet-caches %q: want on, off or ours", c.FleetCaches)
	case c.FleetQueries < 0:
		return fmt.Errorf("-fleet-queries %d: want 0 or more", c.FleetQueries)
	case c.Dashboard.Refreshes < 0:
		return fmt.Errorf("-fleet-dashboard %d: want 0 or more", c.Dashboard.Refreshes)
	case c.Dashboard.Step <= 0 || c.Dashboard.Step%time.Second != 0:
		return fmt.Errorf("-dashboard-step %s: want whole seconds, at least 1s", c.Dashboard.Step)
	case c.Dashboard.Window < c.Dashboard.Step || c.Dashboard.Window/c.Dashboard.Step > 11000:
		return fmt.Errorf("-dashboard-window %s: want at least one step (-dashboard-step %s) and at most 11,000", c.Dashboard.Window, c.Dashboard.Step)
	case tsbs && c.TSBSFile == "":
		return errors.New("-phases tsbs: want the data file in -tsbs FILE")
	case c.Devices < 1:
		return fmt.Errorf("-devices %d: want at least 1", c.Devices)
	case c.Readings < c.Devices:
		return fmt.Errorf("-readings %d: want at least one per device (%d)", c.Readings, c.Devices)
	case c.QueryReadings < c.Devices:
		return fmt.Errorf("-query-readings %d: want at least one per device (%d)", c.QueryReadings, c.Devices)
	case c.Queries < 1:
		return fmt.Errorf("-queries %d: want at least 1", c.Queries)
	case len(c.PacedRates) > 9:
		return fmt.Errorf("-paced-rates: at most 9 rates, got %d", len(c.PacedRates))
	case c.Repeat < 1:
		return fmt.Errorf("-repeat %d: want at least 1", c.Repeat)
	}
	return nil
}

// intList renders ints comma-separated.
func intList(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// parseInts parses comma-separated positive integers; "" is none.
func parseInts(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}
