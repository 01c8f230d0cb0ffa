package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/cmd/internal/lazyfs"
	"github.com/telemetryd/telemetryd/store/replay"
)

// Run performs one crash loop and checks the result.
func Run(ctx context.Context, cfg Config, log *slog.Logger) (Result, error) {
	started := time.Now()
	res := Result{LossBound: cfg.LossBound}
	if cfg.Spread && cfg.Protocol != "lineproto" {
		return res, fmt.Errorf("-spread: only with -protocol lineproto (a NATS or MQTT message has one device), not %q", cfg.Protocol)
	}
	if cfg.CutAt != "" && !cfg.PowerCut {
		return res, errors.New("-cut-at needs -power-cut")
	}
	work, err := os.MkdirTemp("", "telemetry-crashloop-")
	if err != nil {
		return res, err
	}
	if !cfg.Keep {
		defer os.RemoveAll(work)
	}
	if cfg.Binary == "" {
		if cfg.Binary, err = buildService(ctx, work); err != nil {
			return res, err
		}
	}
	var lfs *lazyfs.FS
	if cfg.PowerCut {
		// -data-dir, if given, is the disk under the mount.
		root := cmp.Or(cfg.DataDir, filepath.Join(work, "disk"))
		if cfg.LazyFS == "" {
			return res, errors.New("-power-cut needs -lazyfs, the path of the lazyfs binary (see the crash loop's README)")
		}
		if lfs, err = lazyfs.NewSized(cfg.LazyFS, filepath.Join(work, "lazyfs"), root, cmp.Or(cfg.LazyFSCache, "1gb"), log); err != nil {
			return res, err
		}
		if err := lfs.Mount(ctx); err != nil {
			lfs.Close()
			return res, err
		}
		defer lfs.Close() // after the service stopped: defers run last first
		cfg.DataDir = filepath.Join(lfs.Mnt, "data")
	}
	if cfg.DiskFaults > 0 {
		unmount, err := diskFaultDisk(&cfg, work)
		if err != nil {
			return res, err
		}
		defer unmount() // after the service stopped: defers run last first
	}
	if cfg.DataDir == "" {
		cfg.DataDir = filepath.Join(work, "data")
	}
	if cfg.Backup {
		if cfg.Hostile {
			return res, errors.New("-backup and -hostile cannot be combined")
		}
		cfg.Args = append(cfg.Args, "-backup-dir", filepath.Join(work, "backups"))
	}
	var creds *credentials
	if cfg.Hostile {
		if creds, err = hostileService(&cfg, work); err != nil {
			return res, err
		}
	}
	if cfg.Protocol == "lineproto" {
		// Every write is a request: the loop's rate and its retries
		// after a restart are not what the request rate limit is for.
		cfg.Args = append(cfg.Args, "-http-rate", "0")
	}
	svc, err := newService(cfg, work, log)
	if err != nil {
		return res, err
	}
	if lfs != nil {
		svc.fsExited = lfs.Exited
	}
	log.Info("crash loop", "protocol", cfg.Protocol, "hostile", cfg.Hostile, "power_cut", cfg.PowerCut, "seed", cfg.Seed, "kills", cfg.Kills, "readings", cfg.Readings, "data_dir", cfg.DataDir, "log", svc.logPath)
	if err := svc.start(ctx); err != nil {
		return res, err
	}
	defer svc.stop(15 * time.Second)

	opts := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond), nats.ReconnectBufSize(-1),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Debug("nats async error", "err", err) // the kills cause them
		})}
	var user, password string
	header := http.Header{}
	if creds != nil {
		user, password = loopGateway, creds.loopSecret
		opts = append(opts, nats.UserInfo(user, password))
		header.Set("Authorization", "Bearer "+creds.readToken)
	}
	nc, err := nats.Connect("nats://"+svc.natsAddr, opts...)
	if err != nil {
		return res, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(5*time.Second),
		jetstream.WithPublishAsyncMaxPending(maxInFlight))
	if err != nil {
		return res, err
	}
	pub := &publisher{js: js, cfg: cfg, base: readingsBase(time.Now(), cfg.Readings)}
	switch cfg.Protocol {
	case "", "nats":
	case "mqtt":
		ms, err := newMQTTSender(pub, svc.mqttAddr, user, password)
		if err != nil {
			return res, err
		}
		defer ms.close()
		pub.send = ms.send
	case "lineproto":
		if cfg.Hostile {
			return res, errors.New("-protocol lineproto: not with -hostile")
		}
		pub.send = newLineSender(pub, svc.httpAddr, header).send
		pub.field = lineMeasurement + "_seq" // -line-name-separator _
	default:
		return res, fmt.Errorf("-protocol %q: want nats, mqtt or lineproto", cfg.Protocol)
	}
	pubCtx, cancelPub := context.WithCancel(ctx)
	defer cancelPub()
	pub.start = time.Now()
	pub.pacer = newPacer(pub.start, cfg.Rate, cfg.Batch)
	pubErr := make(chan error, 1)
	go func() { pubErr <- pub.run(pubCtx, log) }()
	stopTraffic, stopHostile := func() {}, func() {}
	if creds != nil {
		res.Hostile = &HostileCounts{}
		h := &hostile{svc: svc, pub: pub, creds: creds, counts: res.Hostile, seed: cfg.Seed, log: log}
		if stopTraffic, stopHostile, err = h.run(ctx); err != nil {
			return res, err
		}
		defer stopHostile()
	}

	var bl *backupLoop
	stopBackups := func() {}
	if cfg.Backup {
		bl = &backupLoop{dir: filepath.Join(work, "backups", "telemetry"), base: "http://" + svc.httpAddr,
			every: cfg.BackupEvery, pub: pub, log: log, start: started}
		bctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); bl.run(bctx) }()
		stopBackups = func() { cancel(); <-done }
	}
	defer stopBackups()
	stopProgress := progress(cfg.Progress, log, pub, res.Hostile)
	defer stopProgress()
	var df *diskFaults
	if cfg.DiskFaults > 0 {
		res.Disk = &DiskFaultCounts{}
		df = &diskFaults{cfg: cfg, svc: svc, pub: pub, js: js, disk: filepath.Join(work, "disk"), log: log, counts: res.Disk}
		if err := df.run(ctx); err != nil {
			return res, err
		}
	} else if err := killLoop(ctx, cfg, svc, lfs, pub, log, &res); err != nil {
		return res, err
	}
	var stalled error
	for waiting := true; waiting; {
		select {
		case stalled = <-pubErr:
			waiting = false
		case <-lazyFSExited(lfs):
			if err := lazyFSCrashCut(ctx, svc, lfs, pub, log, &res); err != nil {
				return res, err
			}
		}
	}
	stopTraffic()
	if stalled != nil && !errors.Is(stalled, errStalled) {
		return res, fmt.Errorf("publish: %w", stalled)
	}
	res.Published = int(pub.acked.Load())
	res.Unacked = cfg.Readings - res.Published
	res.DuplicateAcks = int(pub.duplicates.Load())
	res.Retried = int(pub.errors.Load())
	v := verifier{base: "http://" + svc.httpAddr, pub: pub, header: header}
	if cfg.Hostile || cfg.LossBound > 0 {
		// Readings the hostile flood cost the loop, or that the buffered
		// mode lost in a power cut, never arrive; stop waiting for them
		// once the count stops moving.
		v.settle = 20 * time.Second
	}
	if bl != nil {
		stopBackups()
		if res.Backups = bl.list(); len(res.Backups) == 0 {
			return res, errNoBackup
		}
		if err := restoreService(ctx, svc, bl.dir, work, log); err != nil {
			return res, err
		}
	}
	if err := v.waitStored(ctx, 120*time.Second); err != nil {
		log.Warn("store did not catch up", "err", err)
	}
	if creds != nil {
		// The auth file is still rewritten every second.
		pr := &probe{addr: svc.mqttAddr, user: loopGateway, password: creds.loopSecret, base: pub.base}
		res.Probe = &ProbeCounts{Unchecked: pr.run(ctx)}
		stopHostile()
		if err := pr.check(ctx, v.base, header, 20*time.Second, res.Probe); err != nil {
			return res, err
		}
	}
	if err := v.check(ctx, &res); err != nil {
		return res, err
	}
	if lfs != nil && res.Lost > 0 && cmp.Or(cfg.Protocol, "nats") == "nats" && creds == nil {
		res.Streams = lostInStreams(ctx, js, pub, &res, func() (map[string]uint64, error) {
			all, err := replay.ReadPositions(cfg.DataDir)
			out := map[string]uint64{}
			for name, p := range all {
				out[name] = p.Seq
			}
			return out, err
		})
	}
	if lfs != nil {
		res.LazyFS = lazyFSHealth(lfs)
	}
	if df != nil {
		if err := df.checkCold(ctx); err != nil {
			return res, err
		}
	}
	res.Elapsed = time.Since(started)
	if stalled != nil {
		return res, stalled
	}
	if !res.OK() {
		return res, errors.New("delivery guarantee broken")
	}
	return res, nil
}

// killLoop SIGKILLs the service cfg.Kills times at seeded random
// moments, restarting it each time. With lfs, each kill is a power cut:
// every write the service had not fsynced is lost before the restart.
func killLoop(ctx context.Context, cfg Config, svc *service, lfs *lazyfs.FS, pub *publisher, log *slog.Logger, res *Result) error {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x5eed))
	prev := pub.start // the last restart's end
	for res.Kills < cfg.Kills {
		up := cfg.MinUp + time.Duration(rng.Int64N(int64(cfg.MaxUp-cfg.MinUp)+1))
		select {
		case <-time.After(up):
		case <-lazyFSExited(lfs):
			if err := lazyFSCrashCut(ctx, svc, lfs, pub, log, res); err != nil {
				return err
			}
			continue
		case <-ctx.Done():
			return ctx.Err()
		}
		var inFlight int64
		var at time.Time
		atPoint := false
		if lfs != nil && cfg.TornEvery > 0 && (res.Kills+1)%cfg.TornEvery == 0 {
			done, err := tornCut(ctx, cfg, svc, lfs, pub, log, res, (res.Kills+1)/cfg.TornEvery)
			if err != nil {
				return fmt.Errorf("torn write cut %d: %w", res.Kills+1, err)
			}
			if done {
				if err := restart(ctx, svc, lfs, pub, log, res); err != nil {
					return fmt.Errorf("restart after kill %d: %w", res.Kills, err)
				}
				prev = replan(pub, prev, res.Kills, cfg.Kills, log)
				continue
			}
		}
		if cfg.CutAt != "" {
			var err error
			if atPoint, inFlight, at, err = cutAtPoint(ctx, svc, pub); err != nil {
				return fmt.Errorf("cut %d at %s: %w", res.Kills+1, cfg.CutAt, err)
			}
		} else {
			// A cut is to land while publishes are in flight: past its
			// uptime the service runs until one is.
			inFlight = pub.awaitInFlight(ctx, inFlightWait)
		}
		if err := svc.kill(); err != nil {
			return fmt.Errorf("kill %d: %w", res.Kills+1, err)
		}
		if !atPoint {
			at = time.Now() // the service is dead: no ack comes after
		}
		res.Kills++
		res.Cuts = append(res.Cuts, cut{At: at.Add(cutAckGrace), InFlight: int(inFlight), AtPoint: atPoint})
		if lfs != nil {
			acked := pub.acked.Load()
			usage, uerr := lfs.CacheUsage(ctx)
			if uerr != nil {
				usage = -1
				log.Warn("lazyfs cache usage unknown", "cut", len(res.Cuts), "err", uerr)
			}
			res.Cuts[len(res.Cuts)-1].CacheUsage = usage
			if err := lfs.Cut(ctx); err != nil {
				return fmt.Errorf("power cut %d: %w", res.Kills, err)
			}
			// Numbered as Result.Cuts (unplanned cuts count too), as the
			// lost readings' cuts are.
			log.Info("power cut", "cut", len(res.Cuts), "acked_before", acked, "lazyfs_cache_pct", usage)
		}
		seqs := pub.ackedSeqs.snapshot() // the service is dead: no ack comes after
		if err := restart(ctx, svc, lfs, pub, log, res); err != nil {
			return fmt.Errorf("restart after kill %d: %w", res.Kills, err)
		}
		prev = replan(pub, prev, res.Kills, cfg.Kills, log)
		if lfs != nil {
			noteShortfalls(ctx, pub, len(res.Cuts), seqs, log, res)
		}
	}
	return nil
}

// replan plans the publisher's rest after the done-th of kills cuts,
// whose restart just ended, the one before at prev (pacer); it returns
// now, the prev of the next cut.
func replan(pub *publisher, prev time.Time, done, kills int, log *slog.Logger) time.Time {
	now := time.Now()
	if rate := pub.replanAfterCut(now, pub.start, prev, done, kills); rate > 0 {
		log.Info("publishing planned again", "cut", done, "readings_per_s", int(rate), "cycle", now.Sub(prev).Round(time.Millisecond))
	}
	return now
}

// noteShortfalls records the streams that, after the restart that
// followed cut n, hold less than they had acked before it.
func noteShortfalls(ctx context.Context, pub *publisher, n int, acked map[string]uint64, log *slog.Logger, res *Result) {
	if pub.js == nil || len(acked) == 0 {
		return
	}
	short, err := checkStreams(ctx, pub.js, n, acked)
	if err != nil {
		log.Warn("could not compare the streams with their acks", "cut", n, "err", err)
	}
	for _, s := range short {
		log.Warn("a stream lost messages it had acked", "cut", n, "stream", s.Stream, "acked_seq", s.Acked, "last_seq", s.Last)
	}
	res.StreamShortfalls = append(res.StreamShortfalls, short...)
	floors, err := consumerFloors(ctx, pub.js, slices.Sorted(maps.Keys(acked)))
	if err != nil {
		log.Warn("could not read the consumers' ack floors", "cut", n, "err", err)
	}
	for _, r := range regressed(n, res.floors, floors) {
		log.Warn("a consumer's ack floor went back over a cut", "cut", n, "consumer", r.Stream, "before", r.Before, "after", r.After, "redelivered", r.Redelivs)
		res.ConsumerRegressions = append(res.ConsumerRegressions, r)
	}
	res.floors = floors
}

// lazyFSExited is closed when lfs's LazyFS exits; nil (never ready)
// without LazyFS.
func lazyFSExited(lfs *lazyfs.FS) <-chan struct{} {
	if lfs == nil {
		return nil
	}
	return lfs.Exited()
}

// lazyFSCrashCut handles a LazyFS that exited on its own while the
// service ran (LazyFS aborts, e.g. on a full cache or an internal
// error): what it held unsynced is gone, as in a power cut, so the
// loop finishes the cut (kills the service, which lost its file
// system, mounts again, starts it) and records it as an unplanned cut.
func lazyFSCrashCut(ctx context.Context, svc *service, lfs *lazyfs.FS, pub *publisher, log *slog.Logger, res *Result) error {
	seqs := pub.ackedSeqs.snapshot()
	if err := unplannedCut(ctx, svc, lfs, pub, log, res, "lazyfs exited on its own while the service ran: an unplanned power cut"); err != nil {
		return err
	}
	if err := restart(ctx, svc, lfs, pub, log, res); err != nil {
		return fmt.Errorf("restart after lazyfs exited: %w", err)
	}
	noteShortfalls(ctx, pub, len(res.Cuts), seqs, log, res)
	return nil
}

// unplannedCut records a cut LazyFS made by exiting, kills the service
// (which lost its file system) and mounts again.
func unplannedCut(ctx context.Context, svc *service, lfs *lazyfs.FS, pub *publisher, log *slog.Logger, res *Result, msg string) error {
	inFlight := pub.inFlight.Load()
	at := time.Now()
	if err := svc.kill(); err != nil {
		return fmt.Errorf("kill after lazyfs exited: %w", err)
	}
	res.LazyFSCrashes++
	res.Cuts = append(res.Cuts, cut{At: at.Add(cutAckGrace), InFlight: int(inFlight), Unplanned: true})
	log.Warn(msg, "cut", len(res.Cuts), "acked_before", pub.acked.Load())
	if err := lfs.Cut(ctx); err != nil {
		return fmt.Errorf("mount after lazyfs exited: %w", err)
	}
	return nil
}

// tornCut cuts the power in the middle of a write (-torn-every): the
// n-th torn cut tears the next write to one of the files tornTargets
// names. It reports false when none was written in time (the caller
// then cuts as usual; a fault still armed may crash LazyFS meanwhile,
// which the cut copes with).
func tornCut(ctx context.Context, cfg Config, svc *service, lfs *lazyfs.FS, pub *publisher, log *slog.Logger, res *Result, n int) (bool, error) {
	files, err := tornTargets(cfg.DataDir, n)
	if err != nil {
		log.Warn("no file to tear; cutting as usual", "err", err)
		return false, nil
	}
	var inFlight int64
	var at time.Time
	err = lfs.TornCut(ctx, files, func() error {
		inFlight = pub.inFlight.Load()
		err := svc.kill()
		at = time.Now()
		return err
	})
	if errors.Is(err, lazyfs.ErrNotTorn) {
		log.Warn("no armed file was written; cutting as usual", "files", len(files))
		return false, nil
	}
	if err != nil {
		return false, err
	}
	res.Kills++
	res.Torn++
	res.Cuts = append(res.Cuts, cut{At: at.Add(cutAckGrace), InFlight: int(inFlight)})
	log.Info("power cut with a torn write", "cut", res.Kills, "torn", lfs.LastTorn(), "acked_before", pub.acked.Load())
	return true, nil
}

// tornTargets are the files the n-th torn cut arms, in turn: the
// newest message block of every partition stream (the intake writes
// them all), or the newest memtable log of the newest day table. (The
// value logs are not written: the store keeps values below 1 MiB in
// the tree.)
func tornTargets(dataDir string, n int) ([]string, error) {
	newest := func(pattern string) (string, error) {
		files, err := filepath.Glob(pattern)
		if err != nil || len(files) == 0 {
			return "", fmt.Errorf("no file matches %s", pattern)
		}
		best, bestAt := "", time.Time{}
		for _, f := range files {
			if fi, err := os.Stat(f); err == nil && fi.ModTime().After(bestAt) {
				best, bestAt = f, fi.ModTime()
			}
		}
		if best == "" {
			return "", fmt.Errorf("no file matches %s", pattern)
		}
		return best, nil
	}
	if n%2 == 1 {
		streams, err := filepath.Glob(filepath.Join(dataDir, "nats", "jetstream", "*", "streams", "TELEMETRY_*"))
		if err != nil {
			return nil, err
		}
		var files []string
		for _, st := range streams {
			if blk, err := newest(filepath.Join(st, "msgs", "*.blk")); err == nil {
				files = append(files, blk)
			}
		}
		if len(files) == 0 {
			return nil, errors.New("no stream has a message block")
		}
		return files, nil
	}
	day, err := newest(filepath.Join(dataDir, "tables", "*"))
	if err != nil {
		return nil, err
	}
	mem, err := newest(filepath.Join(day, "*.mem"))
	if err != nil {
		return nil, err
	}
	return []string{mem}, nil
}

// cutAckGrace is added to the moment a cut's service was found dead to
// make the cut's time: an ack read by the loop that late was sent
// before the death, and counts as acked before that cut. (Taken before
// the kill, as it was, an ack arriving while the kill was under way
// counted for the next cut, with the whole next uptime as its age.)
// It can only make a lost reading's age longer.
const cutAckGrace = 250 * time.Millisecond

// inFlightWait bounds how long a cut past its uptime waits for a
// publish in flight; past it (publishing is over) it cuts all the same.
const inFlightWait = 5 * time.Second

// cutPointWait bounds the wait for the service to reach its fault point
// once armed; past it the loop kills it as without -cut-at.
const cutPointWait = 20 * time.Second

// cutAtPoint arms the service's fault point (-cut-at) and waits until
// the service killed itself there. It returns whether it did (else,
// after cutPointWait, the caller kills it), the publishes in flight
// just before, and when it died. The arm file goes before the restart:
// a new instance is not armed until its uptime passed.
func cutAtPoint(ctx context.Context, svc *service, pub *publisher) (bool, int64, time.Time, error) {
	if err := os.WriteFile(svc.armFile, nil, 0o644); err != nil {
		return false, 0, time.Time{}, err
	}
	defer os.Remove(svc.armFile)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	timeout := time.After(cutPointWait)
	inFlight := pub.inFlight.Load()
	for {
		select {
		case <-svc.exited:
			at := time.Now()
			if ws, ok := svc.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				return false, inFlight, at, fmt.Errorf("telemetryd exited on its own (%s), not at its fault point; see %s", svc.cmd.ProcessState, svc.logPath)
			}
			return true, inFlight, at, nil
		case <-tick.C:
			inFlight = pub.inFlight.Load()
		case <-timeout:
			return false, pub.inFlight.Load(), time.Now(), nil
		case <-ctx.Done():
			return false, 0, time.Time{}, ctx.Err()
		}
	}
}

// startAttempts is how often restart starts the service after a power
// cut before it gives up, as a supervisor (systemd's Restart=) would.
const startAttempts = 5

// restart starts the service again. After a power cut a start that
// fails is counted in res.FailedStarts, logged with the service's
// reason, and tried again. A LazyFS that exits during a start is an
// unplanned cut, not a failed start: the loop mounts again and starts
// the service once more (at most startAttempts times in a row).
func restart(ctx context.Context, svc *service, lfs *lazyfs.FS, pub *publisher, log *slog.Logger, res *Result) error {
	crashes := 0
	for attempt := 1; ; attempt++ {
		err := svc.start(ctx)
		if err == nil || lfs == nil || ctx.Err() != nil {
			return err
		}
		if errors.Is(err, errFSGone) || lfs.Crashed() {
			if crashes++; crashes > startAttempts {
				return fmt.Errorf("lazyfs exited during %d starts in a row: %w", crashes, err)
			}
			if err := unplannedCut(ctx, svc, lfs, pub, log, res, "lazyfs exited on its own while the service started: an unplanned power cut"); err != nil {
				return err
			}
			attempt--
			continue
		}
		if attempt == startAttempts {
			return err
		}
		res.FailedStarts++
		log.Warn("start after power cut failed; starting again", "attempt", attempt, "err", err, "reason", svc.lastLogLine())
	}
}

func newService(cfg Config, work string, log *slog.Logger) (*service, error) {
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	natsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	mqttAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	svc := &service{bin: cfg.Binary, dataDir: cfg.DataDir, logPath: filepath.Join(work, "telemetryd.log"),
		httpAddr: httpAddr, natsAddr: natsAddr, mqttAddr: mqttAddr, args: cfg.Args, log: log}
	if cfg.CutAt != "" {
		// Read by cmd/internal/testhook/faultpoint.go.
		svc.armFile = filepath.Join(work, "cut-arm")
		svc.env = []string{"TELEMETRY_TEST_CUT_AT=" + cfg.CutAt, "TELEMETRY_TEST_CUT_ARM=" + svc.armFile}
	}
	return svc, nil
}

// progress logs acked readings (and what the hostile client did, when
// not nil) every interval until stopped.
func progress(every time.Duration, log *slog.Logger, pub *publisher, h *HostileCounts) (stop func()) {
	if every <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		last := int64(0)
		for {
			select {
			case <-done:
				return
			case <-t.C:
				acked := pub.acked.Load()
				args := []any{"acked", acked, "publish_errors", pub.errors.Load(),
					"rate_per_s", float64(acked-last) / every.Seconds()}
				if h != nil {
					args = append(args, "duplicate_acks", pub.duplicates.Load(), "hostile", h.String())
				}
				log.Info("progress", args...)
				last = acked
			}
		}
	}()
	return func() { close(done); <-finished }
}
