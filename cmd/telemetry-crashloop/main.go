// Command telemetry-crashloop proves the delivery guarantee under
// crashes. It starts telemetryd as a separate process, publishes
// numbered readings with JetStream acks and Nats-Msg-Id, SIGKILLs the
// service at random (seeded, replayable) moments, restarts it, and at
// the end reads everything back over HTTP: every acked reading must be
// stored exactly once, and nothing that was never published may appear.
// With -protocol mqtt it publishes MQTT QoS 1 on telemetry/<device>
// through the service's MQTT listener instead, and a reading counts as
// acked once its PUBACK arrived; with -protocol lineproto it writes
// InfluxDB line protocol to POST /api/v2/write, and a reading counts as
// acked once its write was answered 204.
//
// With -power-cut (and -lazyfs, the LazyFS binary) every kill is a
// power cut: the data dir is on a LazyFS mount, and before the restart
// every write the service had not fsynced is dropped (see README.md).
//
// With -hostile the guarantee must hold whatever another client does.
// The service runs with an auth file (the loop publishes with a gateway
// credential for its devices; a second device, hostile-1, may publish
// only on its own subject) and -stream-max-bytes 64MiB, and while the
// loop publishes and the service is killed, hostile-1
//   - publishes on its own subject with the Nats-Msg-Id of every second
//     one of the loop's next messages (the IDs are predictable), before
//     the loop sends them;
//   - floods the stream with invalid payloads of 1 to 6 MiB as fast as
//     they are acked, sending each refused one again;
//   - rewrites the auth file every second (a new secret for an
//     unrelated device) and sends SIGHUP.
//
// Its refusals and disconnects are expected and counted, not failures;
// its own readings are not checked. After the loop, with no kills and
// no flood but the rewrites going on, a QoS 0 probe publishes 1,000
// MQTT QoS 0 readings between two QoS 1 ones on one connection: each
// must be stored, as nothing else can have dropped it. The result
// counts, besides the loop's lost, duplicated and unexpected readings,
// the lost readings whose message was acked as a duplicate (its ID was
// taken), what the hostile client did, and the probe's losses.
// -stall-timeout ends publishing that gets no ack (a stream that stays
// full) and checks what was acked.
//
//	go run ./cmd/telemetry-crashloop -kills 50 -readings 500000 -rate 5000
//	go run ./cmd/telemetry-crashloop -protocol mqtt -kills 10 -readings 200000 -rate 5000
//	go run ./cmd/telemetry-crashloop -hostile -kills 10 -readings 200000 -rate 5000
//	go run ./cmd/telemetry-crashloop -power-cut -lazyfs /opt/lazyfs/lazyfs/build/lazyfs -sync-writes -kills 20 -readings 200000
//	go run ./cmd/telemetry-crashloop -hostile -protocol mqtt -kills 10 -readings 200000 -rate 5000
//	go run ./cmd/telemetry-crashloop -backup -backup-every 10m -kills 20 -max-up 60s -readings 6500000 -rate 5000
//
// With -backup it also takes online backups while it runs and checks a
// restore of the newest one instead of the data dir it wrote (backup.go).
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// Config is one crash-loop run.
type Config struct {
	Binary   string        // telemetryd binary; empty builds ./cmd/telemetryd into a temp dir
	DataDir  string        // empty: a fresh temp dir, removed afterwards unless Keep
	Keep     bool          // keep the data dir
	Kills    int           // SIGKILLs before the final check
	Readings int           // readings to publish in total
	Devices  int           // devices the readings are spread over
	Batch    int           // readings per message
	Rate     int           // readings per second to publish (0: as fast as acks allow)
	MinUp    time.Duration // shortest time the service runs between kills
	MaxUp    time.Duration // longest time the service runs between kills
	Seed     int64         // seeds the kill schedule
	Progress time.Duration // progress line interval
	Args     []string      // extra telemetryd flags (e.g. -sync-writes)
	Protocol string        // nats (JetStream publish acks), mqtt (QoS 1 PUBACKs) or lineproto (204s)
	Hostile  bool          // run the service with credentials and a hostile second client
	// PowerCut puts the data dir on a LazyFS mount and, at each kill,
	// drops every write the service had not fsynced (see cmd/internal/lazyfs).
	PowerCut bool
	LazyFS   string // the lazyfs binary (-power-cut)
	// LazyFSCache is LazyFS's cache (e.g. "1gb", the default): what is
	// written between two cuts must fit, see README.md.
	LazyFSCache string
	// Spread gives each reading of a message its own device (reading
	// seq goes to device seq % Devices), so that a line protocol write
	// carries one message per device and, with -sync-writes, goes into
	// the stream as one atomic batch. Only with Protocol lineproto.
	Spread bool
	// Backup takes an online backup every BackupEvery while the loop
	// runs, then checks a restore of the newest one (backup.go).
	Backup      bool
	BackupEvery time.Duration
	// LossBound, with PowerCut and without -sync-writes, lets the run
	// pass with lost readings as long as each was acked at most this
	// long before its cut (the service's -sync-interval plus 1 s); 0:
	// none may be lost.
	LossBound time.Duration
	// CutAt, with PowerCut, cuts where the service's store stops at a
	// fault point (before-commit, after-commit or either; see
	// cmd/internal/testhook/faultpoint.go) rather than at a random moment: after
	// each uptime the loop arms it and waits until the service killed
	// itself there.
	CutAt string
	// TornEvery, with PowerCut, makes every TornEvery-th cut tear a
	// write (LazyFS's torn-op fault; see tornCut); 0: none.
	TornEvery int
	// StallTimeout ends publishing when no ack came for this long; the
	// check then covers the acked messages (0: wait for every ack).
	StallTimeout time.Duration
	// DiskFaults, instead of kills, fills and frees the data dir's
	// file system this many times and damages a day table (diskfault.go).
	DiskFaults int
	DiskSize   int64         // the tmpfs of -disk-faults
	FillRate   int64         // bytes per second the filler grows at
	FullFor    time.Duration // how long the disk stays full
}

// Result is what the final check found.
type Result struct {
	Kills      int
	Published  int // readings whose message got a JetStream ack
	Stored     int // readings found over HTTP
	Lost       int // acked but not stored
	Duplicated int // stored more than once
	Unexpected int // stored but never published
	Unacked    int // readings whose message was never acked (publishing stalled)
	Retried    int // publishes refused or unanswered, then sent again
	// LostAckedDuplicate counts the lost readings whose message was
	// acked as a duplicate: its Nats-Msg-Id was taken by another
	// client's message.
	LostAckedDuplicate int
	// DuplicateAcks counts publishes acked as duplicates: retries of
	// messages stored before the service was killed, or messages whose
	// Nats-Msg-Id another client used first.
	DuplicateAcks int
	// FailedStarts counts starts after a power cut that failed (the
	// next attempt started the service); any fails the run (OK).
	FailedStarts int
	// Cuts are the kills (power cuts with -power-cut) in order: when
	// each happened and how many publishes were in flight then.
	Cuts []cut
	// Torn counts the cuts that tore a write (-torn-every).
	Torn int
	// LazyFSCrashes counts the unplanned cuts: LazyFS exited on its own.
	LazyFSCrashes int
	// LossBound is Config.LossBound.
	LossBound time.Duration
	// LostAges is, for every lost reading, how long before the first
	// cut after its ack the ack arrived (its age at the cut).
	LostAges []time.Duration
	// LostCuts is, for every lost reading (as LostAges), the number of
	// that cut, from 1 (0: no cut came after its ack).
	LostCuts []int
	// LostSeqs is, for every lost reading (as LostAges), its number.
	LostSeqs []int
	// Streams, with -power-cut, says where the messages of the lost
	// readings still were at the end (nil: not looked at).
	Streams *LostInStreams
	// LazyFS, with -power-cut, is what LazyFS and the kernel reported
	// about it.
	LazyFS *LazyFSHealth
	// StreamShortfalls are the streams that, after a cut, ended below
	// a sequence they had acked before it (with -power-cut, NATS).
	StreamShortfalls []StreamShortfall
	// ConsumerRegressions are the consumers whose ack floor, after a
	// cut, was below the one after the start before (with -power-cut,
	// NATS); floors is the last reading of them.
	ConsumerRegressions []ConsumerRegress
	floors              map[string][2]uint64
	Hostile             *HostileCounts   // what the hostile client did (-hostile)
	Backups             []backupTaken    // the backups taken (-backup)
	Probe               *ProbeCounts     // what the QoS 0 probe found (-hostile)
	Disk                *DiskFaultCounts // what the disk faults did (-disk-faults)
	Elapsed             time.Duration
}

// OK reports whether the run upheld the guarantee and every reading
// was acked.
func (r Result) OK() bool {
	return r.lossOK() && r.Duplicated == 0 && r.Unexpected == 0 && r.Unacked == 0 && r.Stored+r.Lost == r.Published && r.FailedStarts == 0 &&
		(r.Probe == nil || r.Probe.OK()) && (r.Disk == nil || r.Disk.OK())
}

func main() {
	cfg := Config{}
	flag.StringVar(&cfg.Binary, "binary", "", "telemetryd binary (default: build ./cmd/telemetryd)")
	flag.StringVar(&cfg.DataDir, "data-dir", "", "data dir for the service (default: a temp dir)")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the data dir afterwards")
	flag.IntVar(&cfg.Kills, "kills", 50, "how many times to SIGKILL the service")
	flag.IntVar(&cfg.Readings, "readings", 500000, "readings to publish")
	flag.IntVar(&cfg.Devices, "devices", 100, "devices")
	flag.IntVar(&cfg.Batch, "batch", 10, "readings per message")
	flag.BoolVar(&cfg.Spread, "spread", false, "-protocol lineproto: each write's readings over -batch devices, one line each (a write publishes one message per device, as one atomic batch with -sync-writes)")
	flag.IntVar(&cfg.Rate, "rate", 5000, "readings per second (0: as fast as acks allow); spreads publishing over the kills")
	flag.DurationVar(&cfg.MinUp, "min-up", 500*time.Millisecond, "shortest uptime between kills")
	flag.DurationVar(&cfg.MaxUp, "max-up", 3*time.Second, "longest uptime between kills")
	flag.Int64Var(&cfg.Seed, "seed", time.Now().UnixNano(), "seed of the kill schedule (printed, for replay)")
	flag.StringVar(&cfg.Protocol, "protocol", "nats", "publish with nats (JetStream acks), mqtt (QoS 1, PUBACKs) or lineproto (line protocol writes, 204s)")
	flag.DurationVar(&cfg.Progress, "progress", time.Second, "progress interval")
	flag.BoolVar(&cfg.Hostile, "hostile", false, "run the service with an auth file and a 64MiB stream while a second device copies the loop's message IDs, floods invalid payloads and rewrites the auth file every second")
	flag.BoolVar(&cfg.PowerCut, "power-cut", false, "put the data dir on LazyFS and cut the power at every kill: drop every write the service had not fsynced")
	flag.StringVar(&cfg.LazyFS, "lazyfs", "", "lazyfs binary for -power-cut (see cmd/telemetry-crashloop/README.md)")
	flag.StringVar(&cfg.LazyFSCache, "lazyfs-cache", "1gb", "with -power-cut: LazyFS's cache, which must hold everything written between two cuts (each start of the service adds a 128 MiB value log to the index and to the day table, written out in full on the disk under the mount)")
	flag.DurationVar(&cfg.LossBound, "loss-bound", 0, "with -power-cut and without -sync-writes: pass with lost readings if each was acked at most this long before its cut (the service's -sync-interval plus 1s; use -min-up and -max-up longer than it); 0: none may be lost")
	flag.DurationVar(&cfg.StallTimeout, "stall-timeout", 2*time.Minute, "give up publishing when no ack came for this long and check what was acked (0: wait forever)")
	flag.BoolVar(&cfg.Backup, "backup", false, "take an online backup every -backup-every while publishing and killing; at the end restore the newest into a fresh data dir, start the service on it and check that")
	flag.DurationVar(&cfg.BackupEvery, "backup-every", 20*time.Second, "interval of the -backup backups (each incremental against the one before)")
	flag.IntVar(&cfg.DiskFaults, "disk-faults", 0, "instead of kills: fill and free the data dir's file system (a tmpfs of -disk-size) this many times, and damage a cold day table that the loop then repairs as the service's log says (needs root)")
	flag.Int64Var(&cfg.DiskSize, "disk-size", 300<<20, "-disk-faults: size of the tmpfs in bytes")
	flag.Int64Var(&cfg.FillRate, "fill-rate", 32<<20, "-disk-faults: bytes per second the filler grows at")
	flag.DurationVar(&cfg.FullFor, "full-for", 3*time.Second, "-disk-faults: how long the disk stays full")
	sync := flag.Bool("sync-writes", true, "run the service in mode synced (its default); -sync-writes=false: mode buffered")
	flag.StringVar(&cfg.CutAt, "cut-at", "", "with -power-cut: cut where a write reaches the service's fault point, before-commit (in the stream, not yet in the store), after-commit (in the store, its message not yet acked to the stream) or either, instead of at a random moment")
	flag.IntVar(&cfg.TornEvery, "torn-every", 0, "with -power-cut: every N-th cut tears a write (LazyFS torn-op: half of the next write to a partition stream's message block or the memtable log persists, then LazyFS crashes; needs LazyFS built with lazyfs-torn.patch); 0: none")
	logLevel := flag.String("service-log-level", "warn", "the service's -log-level (its log is in the run's directory)")
	flag.Parse()
	cfg.Args = append(cfg.Args, "-sync-writes="+strconv.FormatBool(*sync))
	if *logLevel != "warn" {
		cfg.Args = append(cfg.Args, "-log-level", *logLevel)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := Run(ctx, cfg, log)
	printResult(os.Stdout, cfg, res)
	if err != nil {
		log.Error("crash loop failed", "err", err)
		os.Exit(1)
	}
	if !res.OK() {
		os.Exit(1)
	}
}

// lossOK: nothing lost, or (with LossBound) every lost reading acked
// at most LossBound before the cut that took it.
func (r Result) lossOK() bool {
	if r.Lost == 0 {
		return true
	}
	if r.LossBound <= 0 || len(r.LostAges) != r.Lost {
		return false
	}
	for _, a := range r.LostAges {
		if a < 0 || a > r.LossBound {
			return false
		}
	}
	return true
}

// cut is one kill or power cut.
type cut struct {
	At       time.Time
	InFlight int  // publishes sent and not yet answered at the cut
	AtPoint  bool // the service stopped at its fault point (-cut-at)
	// Unplanned: LazyFS exited on its own while the service ran, which
	// drops what it held unsynced as a cut does.
	Unplanned bool
	// CacheUsage is how full LazyFS's cache was just before the cut, in
	// percent (-1: unknown; 0 without -power-cut).
	CacheUsage float64
}

// cutsAtPoint counts the cuts at the service's fault point (-cut-at).
func (r Result) cutsAtPoint() int {
	n := 0
	for _, c := range r.Cuts {
		if c.AtPoint {
			n++
		}
	}
	return n
}

// cutsInFlight counts the cuts that landed while publishes were in
// flight.
func (r Result) cutsInFlight() int {
	n := 0
	for _, c := range r.Cuts {
		if c.InFlight > 0 {
			n++
		}
	}
	return n
}

// maxLostAge is the oldest lost reading's age at its cut (0: none
// lost).
func (r Result) maxLostAge() time.Duration {
	var m time.Duration
	for _, a := range r.LostAges {
		m = max(m, a)
	}
	return m
}

// cutLoss is what one cut took: how many readings and the oldest's age.
type cutLoss struct {
	cut, lost int
	oldest    time.Duration
}

// lossByCut groups the lost readings by the cut that took them, in cut
// order.
func (r Result) lossByCut() []cutLoss {
	by := map[int]*cutLoss{}
	for i, a := range r.LostAges {
		n := 0
		if i < len(r.LostCuts) {
			n = r.LostCuts[i]
		}
		c := by[n]
		if c == nil {
			c = &cutLoss{cut: n, oldest: a}
			by[n] = c
		}
		c.lost++
		c.oldest = max(c.oldest, a)
	}
	out := make([]cutLoss, 0, len(by))
	for _, c := range by {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b cutLoss) int { return a.cut - b.cut })
	return out
}

func printResult(w io.Writer, cfg Config, r Result) {
	fmt.Fprintf(w, "protocol=%s power_cut=%t seed=%d kills=%d acked=%d stored=%d lost=%d duplicated=%d unexpected=%d unacked=%d retried=%d duplicate_acks=%d lost_acked_duplicate=%d failed_starts=%d elapsed=%s\n",
		cmp.Or(cfg.Protocol, "nats"), cfg.PowerCut, cfg.Seed, r.Kills, r.Published, r.Stored, r.Lost, r.Duplicated, r.Unexpected,
		r.Unacked, r.Retried, r.DuplicateAcks, r.LostAckedDuplicate, r.FailedStarts, r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "cuts: %d of %d while publishes were in flight\n", r.cutsInFlight(), len(r.Cuts))
	if r.LazyFSCrashes > 0 {
		fmt.Fprintf(w, "unplanned cuts (lazyfs exited on its own): %d\n", r.LazyFSCrashes)
	}
	if cfg.TornEvery > 0 {
		fmt.Fprintf(w, "cuts with a torn write: %d of %d\n", r.Torn, len(r.Cuts))
	}
	if cfg.CutAt != "" {
		fmt.Fprintf(w, "cuts at the fault point %s: %d of %d\n", cfg.CutAt, r.cutsAtPoint(), len(r.Cuts))
	}
	if len(r.LostAges) > 0 {
		fmt.Fprintf(w, "lost readings' ages at their cut: %d, the oldest %s\n", len(r.LostAges), r.maxLostAge().Round(time.Millisecond))
		for _, c := range r.lossByCut() {
			fmt.Fprintf(w, "  cut %d: lost %d, the oldest %s\n", c.cut, c.lost, c.oldest.Round(time.Millisecond))
		}
	}
	if r.Streams != nil {
		fmt.Fprintln(w, r.Streams)
	}
	if cfg.PowerCut && cmp.Or(cfg.Protocol, "nats") == "nats" {
		fmt.Fprintf(w, "streams below their acks after a cut: %d\n", len(r.StreamShortfalls))
		for _, s := range r.StreamShortfalls {
			fmt.Fprintf(w, "  %s\n", s)
		}
		fmt.Fprintf(w, "consumers whose ack floor went back over a cut: %d\n", len(r.ConsumerRegressions))
		for _, c := range r.ConsumerRegressions {
			fmt.Fprintf(w, "  %s\n", c)
		}
	}
	if r.LazyFS != nil {
		fmt.Fprintln(w, r.LazyFS.String(r.Cuts))
	}
	if r.Hostile != nil {
		fmt.Fprintf(w, "hostile: %s\n", r.Hostile)
	}
	if r.Probe != nil {
		fmt.Fprintf(w, "qos0 probe: %s\n", r.Probe)
	}
	if r.Disk != nil {
		fmt.Fprintf(w, "disk faults: %s\n", r.Disk)
	}
	for _, b := range r.Backups {
		fmt.Fprintln(w, b)
	}
}
