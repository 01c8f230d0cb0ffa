// Command telemetry-faults runs a telemetryd cluster under network and
// process faults and checks what it promised.
//
// It puts each of three NATS servers (JetStream, clustered, fsync before
// every ack) and three telemetryd nodes (-partitions, -copies 2,
// -sync-writes) in its own network namespace, on a bridge of its own,
// and talks to them from the host: clients publish readings with
// JetStream acks and write them as line protocol to the nodes in turn,
// recording every ack in a ledger; a querier reads devices from the
// nodes. Meanwhile it injects faults on a schedule from -seed: a
// process cut off from the others, a machine (a NATS server and its
// node) split from the other two, a bridge (two machines cut from each
// other, the third reaching both), tc netem delay, loss and reordering
// (a token bucket and random drops where the kernel lacks netem),
// SIGSTOP of a node or a NATS server for longer than the lease TTL,
// a truncated or bit-flipped data file of one process before it
// restarts, a node restarted with its clock a minute ahead or behind
// (TELEMETRY_CLOCK_OFFSET, telemetryd's test hook), and with -lazyfs a power cut of one machine (its NATS
// server and node) and of all machines at once: each process's disk is a
// LazyFS mount that drops every write not fsynced (cmd/internal/lazyfs);
// without -lazyfs, crashes (SIGKILL) of one machine and of all instead.
// By default the cluster has a stream per partition (-partition-streams).
// Then it heals everything and checks:
//
//   - every acked reading is stored on each owner of its partition, once,
//     under its own device (lost, duplicated, misattributed);
//   - no partition was claimed by more nodes than -copies plus one (a
//     hand-over) for longer than the lease TTL (double serving);
//   - every query answered during the faults was correct (every reading
//     acked more than -stale-bound before it was there, nothing else),
//     a 503 naming the device's partition, or marked partial.
//
// It prints the faults with their times and the checks, and exits
// non-zero on any violation. It needs root (namespaces, iptables, tc).
//
//	go run ./cmd/telemetry-faults -faults 52 -duration 30m -seed 4040
//	go run ./cmd/telemetry-faults -faults 52 -duration 20m -seed 4040 -lazyfs /opt/tools/bin/lazyfs -rate 32
//
// It tears down its namespaces, bridge and processes on every exit,
// ctrl-C and SIGTERM included (README.md); its network names carry a random run ID, so runs side
// by side do not clash.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"
)

// Config is one run.
type Config struct {
	Binary      string        // telemetryd; empty builds ./cmd/telemetryd
	WorkDir     string        // parent of the run's directory (logs, data); empty: the temp dir
	Keep        bool          // keep the run's directory even when it passed
	Seed        int64         // seeds the schedule, the clients and the queries
	Faults      int           // faults to inject
	Gap         time.Duration // mean pause between faults
	FaultsFor   time.Duration // no new fault after the faults have gone on this long (0: no bound)
	Partitions  int
	Copies      int
	LeaseTTL    time.Duration
	Devices     int
	Rate        float64       // readings per second over all clients
	QueryEvery  time.Duration // pause between queries
	StaleBound  time.Duration // an answer may miss readings acked less than this before it
	Settle      time.Duration // publishing goes on this long after the last heal
	StoreWait   time.Duration // how long the final check waits for acked readings to be stored
	Progress    time.Duration
	LazyFS      string // the lazyfs binary: each machine's disk on LazyFS, and power cuts of one and of all machines
	LazyFSCache string // LazyFS's cache of a node's disk: must hold all the node writes between two cuts
	NATSCache   string // LazyFS's cache of a NATS server's disk, likewise
	// PartitionStreams runs the cluster with a stream per partition
	// (telemetryd -partition-streams and the NATS servers' mapping of
	// telemetry.* to telemetry.<partition>.*, as deploy/ sets it up).
	PartitionStreams bool
	NodeArgs         []string // extra telemetryd flags

	// failFault, in tests, runs after fault n was injected and healed;
	// its error fails the fault as a process that does not exit would.
	failFault func(n int, f *fault) error
}

// lazyFSRate is the rate (readings per second over all clients) the
// runs on LazyFS use: with every disk on LazyFS on a machine of two busy
// cores, 80 a second (each reading a message fsynced by the stream and
// the raft logs of three servers, through LazyFS's daemon) kept the
// servers so busy that their route connections missed their write
// deadline.
const lazyFSRate = 32

// DefaultConfig is a short run.
func DefaultConfig() Config {
	return Config{Seed: time.Now().UnixNano(), Faults: 7, Gap: 6 * time.Second, Partitions: 6, Copies: 2,
		LeaseTTL: 3 * time.Second, Devices: 24, Rate: 80, QueryEvery: 300 * time.Millisecond,
		StaleBound: 30 * time.Second, Settle: 5 * time.Second, StoreWait: 2 * time.Minute, Progress: 10 * time.Second,
		LazyFSCache: "1gb", NATSCache: "256mb", PartitionStreams: true}
}

// Result is what a run did and found.
type Result struct {
	Seed          int64
	WorkDir       string
	Faults        []fault
	Sent, Acked   int
	PublishErrors int
	WriteErrors   int
	Checked       int // device copies read in the final check
	Lost          int
	Duplicated    int
	Misattributed int
	Unexpected    int
	Queries       []query
	Writes        []answer
	DoubleServed  []overServed
	Trailing      map[string]int // samples of /v1/cluster in which a node answered a partition from a trailing copy, by "node-j pN"
	Findings      []string
	// Repairs are the repairs of damaged day tables the final check ran
	// as the nodes advised (those during the faults are in their
	// fault's What).
	Repairs []string
	// StoppedEarly says that Config.FaultsFor ended the schedule before
	// Config.Faults faults (empty: it did not).
	StoppedEarly string
	// Incomplete is what kept the run or its checks from being whole: a
	// node not ready for the final check, a device that could not be
	// read, a heal that failed. The run fails.
	Incomplete []string
	Unchecked  int // owner copies the final check could not read
	Elapsed    time.Duration
}

// badQueries are the queries whose answer broke the rules.
func (r Result) badQueries() []query {
	return slices.DeleteFunc(slices.Clone(r.Queries), func(q query) bool { return !q.bad })
}

// OK reports whether no check found a violation.
func (r Result) OK() bool {
	return r.Acked > 0 && r.Lost == 0 && r.Duplicated == 0 && r.Misattributed == 0 && r.Unexpected == 0 &&
		len(r.DoubleServed) == 0 && len(r.badQueries()) == 0 && len(r.faultViolations()) == 0 &&
		len(r.failedFaults()) == 0 && len(r.Incomplete) == 0 && r.Unchecked == 0
}

// failedFaults are the faults whose injection failed.
func (r Result) failedFaults() []fault {
	return slices.DeleteFunc(slices.Clone(r.Faults), func(f fault) bool { return f.Err == "" })
}

// faultViolations are the faults that found something wrong themselves.
func (r Result) faultViolations() []fault {
	return slices.DeleteFunc(slices.Clone(r.Faults), func(f fault) bool { return f.Violation == "" })
}

func main() {
	if path := os.Getenv(natsConfigEnv); path != "" {
		if err := runNATSServer(path); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	cfg := DefaultConfig()
	var dur time.Duration
	flag.StringVar(&cfg.Binary, "binary", "", "telemetryd binary (default: build ./cmd/telemetryd)")
	flag.StringVar(&cfg.WorkDir, "work-dir", "", "where the run's directory (logs, data) goes (default: the temp dir)")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the run's directory even when it passed (it is kept when it fails)")
	flag.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the fault schedule, the clients and the queries (printed, for replay)")
	flag.IntVar(&cfg.Faults, "faults", cfg.Faults, "faults to inject, one at a time, the kinds in turn")
	flag.DurationVar(&dur, "duration", 0, "spread the faults over about this long (sets -gap); 0: use -gap")
	flag.DurationVar(&cfg.Gap, "gap", cfg.Gap, "mean pause between a heal and the next fault")
	flag.DurationVar(&cfg.FaultsFor, "faults-for", 0, "inject no new fault once the faults have gone on this long, then heal and check as after the last (0: no bound); for a run that must end in time")
	flag.IntVar(&cfg.Partitions, "partitions", cfg.Partitions, "telemetryd -partitions")
	flag.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "telemetryd -lease-ttl; faults are held 2 to 5 times as long")
	flag.IntVar(&cfg.Devices, "devices", cfg.Devices, "devices the readings go to")
	flag.Float64Var(&cfg.Rate, "rate", cfg.Rate, "readings per second, over all clients")
	flag.DurationVar(&cfg.QueryEvery, "query-every", cfg.QueryEvery, "pause between two queries")
	flag.DurationVar(&cfg.StaleBound, "stale-bound", cfg.StaleBound, "an answer may miss readings acked less than this before the query")
	flag.DurationVar(&cfg.StoreWait, "store-wait", cfg.StoreWait, "how long the final check waits for every acked reading to be stored")
	flag.DurationVar(&cfg.Progress, "progress", cfg.Progress, "progress line interval")
	flag.StringVar(&cfg.LazyFSCache, "lazyfs-cache", cfg.LazyFSCache, "LazyFS's cache of each node's disk (it keeps synced writes too, never evicts, and hangs when full): more than a node writes between two power cuts")
	flag.StringVar(&cfg.NATSCache, "lazyfs-nats-cache", cfg.NATSCache, "LazyFS's cache of each NATS server's disk, likewise")
	flag.StringVar(&cfg.LazyFS, "lazyfs", os.Getenv("TELEMETRY_LAZYFS"), "the lazyfs binary (default $TELEMETRY_LAZYFS): put each machine's disk on LazyFS and add power cuts of one machine and of all machines (see cmd/telemetry-crashloop/README.md)")
	flag.BoolVar(&cfg.PartitionStreams, "partition-streams", cfg.PartitionStreams, "a stream per partition (telemetryd -partition-streams, the NATS servers mapping the subjects), as deploy/ runs a cluster; false: the one stream TELEMETRY")
	flag.Parse()
	cfg.NodeArgs = flag.Args()
	if dur > 0 && cfg.Faults > 0 {
		// a fault holds 2 to 5 lease TTLs, 3.5 on average
		cfg.Gap = max(time.Second, dur/time.Duration(cfg.Faults)-7*cfg.LeaseTTL/2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := Run(ctx, cfg, log)
	printResult(os.Stdout, cfg, res)
	if err != nil {
		log.Error("fault run failed", "err", err)
		os.Exit(1)
	}
	if !res.OK() {
		os.Exit(1)
	}
}

// printResult prints the faults, the checks and the verdict.
func printResult(w io.Writer, cfg Config, r Result) {
	fmt.Fprintf(w, "seed=%d faults=%d partitions=%d partition_streams=%t copies=%d lease_ttl=%s lazyfs=%t elapsed=%s\n", r.Seed, len(r.Faults), cfg.Partitions, cfg.PartitionStreams, cfg.Copies, cfg.LeaseTTL, cfg.LazyFS != "", r.Elapsed.Round(time.Second))
	fmt.Fprintln(w, "faults:")
	kinds := map[string]int{}
	for _, f := range r.Faults {
		kinds[f.Kind]++
		fmt.Fprintln(w, "  "+f.String())
	}
	fmt.Fprintf(w, "fault kinds: %v\n", kinds)
	if r.StoppedEarly != "" {
		fmt.Fprintln(w, r.StoppedEarly)
	}
	fmt.Fprintf(w, "readings: sent=%d acked=%d publish_retries=%d write_refusals=%d\n", r.Sent, r.Acked, r.PublishErrors, r.WriteErrors)
	fmt.Fprintf(w, "faults failed: %d\n", len(r.failedFaults()))
	for _, f := range r.failedFaults() {
		fmt.Fprintf(w, "  %s %s: %s\n", f.At.UTC().Format("15:04:05.000"), f.Kind, f.Err)
	}
	fmt.Fprintf(w, "check stored: owner_copies_read=%d unchecked=%d lost=%d duplicated=%d misattributed=%d unexpected=%d\n", r.Checked, r.Unchecked, r.Lost, r.Duplicated, r.Misattributed, r.Unexpected)
	verdicts := map[string]int{}
	for _, q := range r.Queries {
		v := q.verdict
		if q.bad {
			v = "violation"
		}
		verdicts[v]++
	}
	fmt.Fprintf(w, "check queries: %d answers %v\n", len(r.Queries), verdicts)
	for _, q := range head2(r.badQueries(), 10) {
		fmt.Fprintf(w, "  %s %s %s (partition %d): %s\n", q.at.UTC().Format("15:04:05.000"), q.node, deviceName(q.device), q.partition, q.verdict)
	}
	writes := map[string]int{}
	for _, a := range r.Writes {
		writes[fmt.Sprintf("%s:%d", a.node, a.status)]++
	}
	fmt.Fprintf(w, "writes by node:status: %v\n", writes)
	fmt.Fprintf(w, "trailing copies answering (samples of /v1/cluster, one a second per node): %v\n", r.Trailing)
	fmt.Fprintf(w, "check faults: %d found something wrong themselves\n", len(r.faultViolations()))
	for _, f := range r.faultViolations() {
		fmt.Fprintf(w, "  %s %s: %s\n", f.At.UTC().Format("15:04:05.000"), f.Kind, f.Violation)
	}
	fmt.Fprintf(w, "check double serving: %d intervals longer than the lease TTL\n", len(r.DoubleServed))
	for _, o := range r.DoubleServed {
		fmt.Fprintf(w, "  partition %d claimed by nodes %v from %s to %s\n", o.partition, o.nodes, o.from.UTC().Format("15:04:05.000"), o.to.UTC().Format("15:04:05.000"))
	}
	for _, f := range r.Findings {
		fmt.Fprintln(w, "  "+f)
	}
	fmt.Fprintf(w, "repairs advised by a node and run before the final check: %d\n", len(r.Repairs))
	for _, s := range r.Repairs {
		fmt.Fprintln(w, "  "+s)
	}
	fmt.Fprintf(w, "incomplete: %d\n", len(r.Incomplete))
	for _, s := range r.Incomplete {
		fmt.Fprintln(w, "  "+s)
	}
	verdict := "PASS"
	if !r.OK() {
		verdict = "FAIL"
	}
	fmt.Fprintln(w, verdict)
}

func head2[T any](s []T, n int) []T { return s[:min(len(s), n)] }
