package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The fault kinds, in the order the schedule cycles through them (a
// run of at least as many faults as kinds has each).
const (
	faultIsolate   = "isolate"    // one process's namespace cut off from every other
	faultSplit     = "split"      // one machine (a NATS server and a node) against the other two
	faultBridge    = "bridge"     // machines a and c cut from each other, b reaching both
	faultPauseNode = "pause-node" // SIGSTOP of a node for longer than the lease TTL
	faultPauseNATS = "pause-nats" // SIGSTOP of a NATS server for longer than the lease TTL
	faultNetem     = "netem"      // delay, loss and reordering on some links
	faultCorrupt   = "corrupt"    // a node's or its NATS server's file truncated or bit-flipped, then restarted
	faultClock     = "clock"      // a node restarted with its clock a minute ahead or behind, then restarted right
	faultPowerOne  = "power-one"  // a power cut of one machine (LazyFS)
	faultPowerAll  = "power-all"  // a power cut of every machine at once (LazyFS)
	faultCrashOne  = "crash-one"  // without LazyFS: one machine's processes SIGKILLed and started again
	faultCrashAll  = "crash-all"  // without LazyFS: every machine's processes SIGKILLed and started again
)

// faultKinds are the kinds a run with cfg injects. Without LazyFS a
// machine cannot lose its unsynced writes: the power cuts are crashes
// then (its processes SIGKILLed, the kernel keeping what they wrote).
func faultKinds(cfg Config) []string {
	k := []string{faultIsolate, faultPauseNode, faultSplit, faultNetem, faultPauseNATS, faultBridge, faultCorrupt, faultClock}
	if cfg.LazyFS != "" {
		return append(k, faultPowerOne, faultPowerAll)
	}
	return append(k, faultCrashOne, faultCrashAll)
}

// fault is one injected fault as the output lists it.
type fault struct {
	Kind   string
	What   string // which processes or links, and how
	At     time.Time
	Healed time.Time
	Err    string // the injection failed (the run fails, after its checks)
	// Violation is what the fault itself found wrong (the run fails).
	Violation string
}

func (f fault) String() string {
	s := fmt.Sprintf("%s %-10s %-60s healed after %s", f.At.UTC().Format("15:04:05.000"), f.Kind, f.What, f.Healed.Sub(f.At).Round(100*time.Millisecond))
	if f.Err != "" {
		s += " ERROR " + f.Err
	}
	if f.Violation != "" {
		s += " VIOLATION " + f.Violation
	}
	return s
}

// faultLoop injects cfg.Faults faults, one at a time: a kind in turn
// (shuffled per round by the seed), held for a seeded time longer than
// the lease TTL, healed, then a seeded pause for the cluster to recover.
func (c *cluster) faultLoop(ctx context.Context, rng *rand.Rand, res *Result) error {
	kinds := faultKinds(c.cfg)
	var order []string
	began := time.Now()
	for i := range c.cfg.Faults {
		if c.cfg.FaultsFor > 0 && time.Since(began) > c.cfg.FaultsFor {
			res.StoppedEarly = fmt.Sprintf("faults stopped after %s (-faults-for): %d of %d injected", time.Since(began).Round(time.Second), i, c.cfg.Faults)
			c.log.Info("fault schedule ends at its time bound", "injected", i, "of", c.cfg.Faults, "faults_for", c.cfg.FaultsFor)
			return nil
		}
		if len(order) == 0 {
			order = slices.Clone(kinds)
			if i > 0 {
				rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
			}
		}
		kind := order[0]
		order = order[1:]
		sleepCtx(ctx, c.cfg.Gap/2+time.Duration(rng.Int64N(int64(c.cfg.Gap))))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := c.diskCrashes(ctx, res); err != nil {
			res.StoppedEarly = fmt.Sprintf("faults stopped before fault %d: %v", i+1, err)
			return nil
		}
		hold := 2*c.cfg.LeaseTTL + time.Duration(rng.Int64N(int64(3*c.cfg.LeaseTTL)))
		f := fault{Kind: kind, At: time.Now()}
		c.log.Info("fault begins", "n", i+1, "kind", kind)
		err := c.inject(ctx, rng, &f, hold)
		if c.cfg.failFault != nil && err == nil {
			err = c.cfg.failFault(i+1, &f)
		}
		f.Healed = time.Now()
		if err != nil && len(c.crashedDisks()) > 0 {
			// The disk of a process the fault restarted died under it:
			// the machine loses its power (diskCrashes, next).
			f.What += "; cut short by a LazyFS exit: " + lastLine(err.Error())
			err = nil
		}
		if err == nil && ctx.Err() == nil {
			err = c.operatorPass(ctx)
		}
		for _, n := range c.operatorNotes() {
			f.What += "; " + n
		}
		var rerr error
		if err != nil {
			// The run fails, but its checks are still made: put the
			// cluster back together first.
			f.Err = err.Error()
			c.log.Warn("fault failed; recovering", "n", i+1, "kind", f.Kind)
			if ctx.Err() == nil {
				rerr = c.recoverFrom(ctx, &f, res)
			}
		}
		res.Faults = append(res.Faults, f)
		level := slog.LevelInfo
		if f.Err != "" {
			level = slog.LevelError
		}
		c.log.Log(ctx, level, "fault", "n", i+1, "of", c.cfg.Faults, "kind", f.Kind, "what", f.What, "held", f.Healed.Sub(f.At).Round(time.Millisecond), "err", f.Err)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if rerr != nil {
			res.StoppedEarly = fmt.Sprintf("faults stopped after fault %d (%s) failed: the cluster did not recover: %v", i+1, kind, rerr)
			return nil
		}
		if err := c.diskCrashes(ctx, res); err != nil {
			res.StoppedEarly = fmt.Sprintf("faults stopped after fault %d: %v", i+1, err)
			return nil
		}
	}
	return nil
}

// faultDiskExit is not a kind of the schedule: a LazyFS process that
// exited by itself (it has crashed under heavy writes, a segfault in its
// cache) takes its disk away from under its process, as a dead disk
// does; the harness then cuts the power of that machine, which drops
// nothing more (LazyFS's unsynced writes died with it), and starts it
// again. The checks hold it to the same promises as a planned cut.
const faultDiskExit = "disk-exit"

// crashedDisks are the members whose LazyFS process has exited.
func (c *cluster) crashedDisks() []int {
	var out []int
	for m, l := range c.lfs {
		if l != nil && l.crashed() {
			out = append(out, m)
		}
	}
	return out
}

// diskCrashes cuts the power of every machine one of whose LazyFS
// processes exited by itself, and records it as a fault.
func (c *cluster) diskCrashes(ctx context.Context, res *Result) error {
	// Another LazyFS may exit while a machine comes back: a few rounds.
	for round := 0; len(c.crashedDisks()) > 0; round++ {
		if round == 3 {
			return fmt.Errorf("LazyFS of %v keeps exiting", c.crashedDisks())
		}
		if err := c.diskCrashRound(ctx, res); err != nil && len(c.crashedDisks()) == 0 {
			return err
		}
	}
	return nil
}

// diskCrashRound cuts the power of each machine with a crashed disk once.
func (c *cluster) diskCrashRound(ctx context.Context, res *Result) error {
	machines := map[int]bool{}
	var names []string
	hung := false
	c.diskMu.Lock()
	for _, m := range c.crashedDisks() {
		machines[m%servers] = true
		names = append(names, c.net.members[m])
		hung = hung || c.diskHung[m]
		delete(c.diskHung, m)
	}
	c.diskMu.Unlock()
	how := "exited by itself (its lazyfs.out, dmesg)"
	if hung {
		how = "stopped answering (killed by the harness) or exited by itself"
	}
	for k := range servers {
		if !machines[k] {
			continue
		}
		f := fault{Kind: faultDiskExit, At: time.Now(),
			What: fmt.Sprintf("LazyFS of %s %s; power cut of nats-%d and node-%d", strings.Join(names, ","), how, k, k)}
		err := c.powerCut(ctx, []int{k}, &f)
		f.Healed = time.Now()
		if err != nil && len(c.crashedDisks()) > 0 {
			// Another disk died while this machine came back: its
			// power is cut in the next round, as for a scheduled fault.
			f.What += "; cut short by a LazyFS exit: " + lastLine(err.Error())
			err = nil
		}
		if err != nil {
			f.Err = err.Error()
		}
		res.Faults = append(res.Faults, f)
		c.log.Warn("fault", "kind", f.Kind, "what", f.What, "held", f.Healed.Sub(f.At).Round(time.Millisecond), "err", f.Err)
		if err != nil {
			return fmt.Errorf("after a LazyFS exit: %w", err)
		}
	}
	return nil
}

// inject does one fault of the kind f.Kind, holds it and heals it.
func (c *cluster) inject(ctx context.Context, rng *rand.Rand, f *fault, hold time.Duration) error {
	names := func(ms []int) string {
		var s []string
		for _, m := range ms {
			s = append(s, c.net.members[m])
		}
		return strings.Join(s, ",")
	}
	machine := func(k int) []int { return []int{k, servers + k} } // NATS server k and node k
	cutGroups := func(a, b []int) error {
		for _, x := range a {
			for _, y := range b {
				if err := c.net.cut(ctx, x, y); err != nil {
					return err
				}
			}
		}
		return nil
	}
	healNet := func() error {
		sleepCtx(ctx, hold)
		return c.net.heal(context.WithoutCancel(ctx))
	}
	all := []int{0, 1, 2, 3, 4, 5}
	switch f.Kind {
	case faultIsolate:
		m := rng.IntN(len(all))
		f.What = c.net.members[m] + " cut off from every other process"
		if err := cutGroups([]int{m}, slices.DeleteFunc(slices.Clone(all), func(x int) bool { return x == m })); err != nil {
			return err
		}
		return healNet()
	case faultSplit:
		k := rng.IntN(servers)
		minority := machine(k)
		majority := slices.DeleteFunc(slices.Clone(all), func(x int) bool { return slices.Contains(minority, x) })
		f.What = fmt.Sprintf("{%s} | {%s}", names(minority), names(majority))
		if err := cutGroups(minority, majority); err != nil {
			return err
		}
		return healNet()
	case faultBridge:
		p := rng.Perm(servers)
		a, b, cc := machine(p[0]), machine(p[1]), machine(p[2])
		f.What = fmt.Sprintf("{%s} | {%s}, {%s} reaching both", names(a), names(cc), names(b))
		if err := cutGroups(a, cc); err != nil {
			return err
		}
		return healNet()
	case faultPauseNode, faultPauseNATS:
		procs := c.nodes
		if f.Kind == faultPauseNATS {
			procs = c.nats
		}
		p := procs[rng.IntN(len(procs))]
		f.What = fmt.Sprintf("SIGSTOP %s for %s (lease TTL %s)", p.name, hold.Round(time.Millisecond), c.cfg.LeaseTTL)
		if err := p.signal(syscall.SIGSTOP); err != nil {
			return err
		}
		sleepCtx(ctx, hold)
		return p.signal(syscall.SIGCONT)
	case faultNetem:
		ms := rng.Perm(len(all))[:1+rng.IntN(3)]
		delay := 50 + rng.IntN(250)
		loss := rng.IntN(10)
		if c.netem {
			args := []string{"delay", fmt.Sprintf("%dms", delay), fmt.Sprintf("%dms", delay/4), "loss", fmt.Sprintf("%d%%", loss), "reorder", "25%", "50%"}
			f.What = fmt.Sprintf("netem %s on %s", strings.Join(args, " "), names(ms))
			for _, m := range ms {
				if err := c.net.netem(ctx, m, args...); err != nil {
					return err
				}
			}
			return healNet()
		}
		rate := fmt.Sprintf("%dkbit", 256<<rng.IntN(3))
		latency := fmt.Sprintf("%dms", 2*delay)
		f.What = fmt.Sprintf("no netem in this kernel: tbf rate %s latency %s, %d%% loss (iptables) on %s", rate, latency, loss, names(ms))
		for _, m := range ms {
			if err := c.net.slowLink(ctx, m, rate, latency, float64(loss)/100); err != nil {
				return err
			}
		}
		return healNet()
	case faultCorrupt:
		return c.corrupt(ctx, rng, f)
	case faultClock:
		return c.clockOffset(ctx, rng, f, hold)
	case faultPowerOne, faultCrashOne:
		// Without LazyFS a cut loses nothing the kernel holds: a crash.
		what := map[string]string{faultPowerOne: "power cut", faultCrashOne: "crash (SIGKILL)"}[f.Kind]
		k := rng.IntN(servers)
		f.What = fmt.Sprintf("%s of nats-%d and node-%d", what, k, k)
		return c.powerCut(ctx, []int{k}, f)
	case faultPowerAll:
		f.What = "power cut of every machine"
		return c.powerCut(ctx, []int{0, 1, 2}, f)
	case faultCrashAll:
		f.What = "crash (SIGKILL) of every machine"
		return c.powerCut(ctx, []int{0, 1, 2}, f)
	}
	return fmt.Errorf("unknown fault kind %q", f.Kind)
}

// corrupt stops one process (a node or a NATS server), damages one of
// its data files (truncates it to a seeded length, or flips bytes at
// seeded offsets) and starts it again. A node that then refuses to start
// is what an operator would see: the harness records it and, as the
// operator would, starts it on an empty data dir, from which it catches
// up from the stream.
func (c *cluster) corrupt(ctx context.Context, rng *rand.Rand, f *fault) error {
	procs := append(slices.Clone(c.nats), c.nodes...)
	p := procs[rng.IntN(len(procs))]
	if err := p.kill(); err != nil {
		return err
	}
	files := dataFiles(p.dataDir)
	if len(files) == 0 {
		f.What = p.name + ": no data file to damage"
		return c.restart(ctx, p, f)
	}
	slices.Sort(files)
	file := files[rng.IntN(len(files))]
	rel, _ := filepath.Rel(p.dataDir, file)
	st, err := os.Stat(file)
	if err != nil {
		return err
	}
	if rng.IntN(2) == 0 {
		n := rng.Int64N(st.Size())
		f.What = fmt.Sprintf("%s: %s truncated from %d to %d bytes", p.name, rel, st.Size(), n)
		if err := os.Truncate(file, n); err != nil {
			return err
		}
	} else {
		fh, err := os.OpenFile(file, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		var offs []int64
		for range 3 {
			off := rng.Int64N(st.Size())
			offs = append(offs, off)
			b := []byte{0}
			if _, err := fh.ReadAt(b, off); err != nil {
				fh.Close()
				return err
			}
			b[0] ^= 1 << rng.IntN(8)
			if _, err := fh.WriteAt(b, off); err != nil {
				fh.Close()
				return err
			}
		}
		fh.Close()
		f.What = fmt.Sprintf("%s: %s (%d bytes) bits flipped at %v", p.name, rel, st.Size(), offs)
	}
	return c.restart(ctx, p, f)
}

// dataFiles lists the non-empty files under dir that hold data: a
// JetStream message block or index, a Badger table or value log.
func dataFiles(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		switch filepath.Ext(path) {
		case ".blk", ".idx", ".sst", ".vlog":
			if st, err := d.Info(); err == nil && st.Size() > 0 {
				out = append(out, path)
			}
		}
		return nil
	})
	return out
}

// restart starts p after a fault and waits until it is ready. A node
// that refuses to start is started again, as a supervisor would: while
// it refuses for want of NATS (a stream without a leader yet), for up to
// restartPatience; when it refuses its own data three times, it is
// started on an empty data dir, as an operator would, and catches up
// from the stream. f notes the refusals.
func (c *cluster) restart(ctx context.Context, p *proc, f *fault) error {
	j := slices.Index(c.nodes, p)
	began := time.Now()
	for refused, ofData := 0, 0; ofData < 3; refused++ {
		if err := p.start(); err != nil {
			return err
		}
		if j < 0 {
			return nil // a NATS server: it recovers (or not) on its own; the checks tell
		}
		err := c.readyRepairing(ctx, j, 2*time.Minute)
		if err == nil {
			return nil
		}
		line := lastLine(p.lastLines(1))
		if refused < 3 {
			f.What += fmt.Sprintf("; start %d refused (%s)", refused+1, line)
		}
		if err := p.kill(); err != nil {
			return err
		}
		if refusesItsData(line) {
			ofData++
			continue
		}
		if time.Since(began) > restartPatience || ctx.Err() != nil {
			return fmt.Errorf("%s not ready %s after the fault, %d starts refused: %w", p.name, time.Since(began).Round(time.Second), refused+1, err)
		}
		sleepCtx(ctx, time.Second)
	}
	f.What += "; started on an empty data dir"
	if err := os.RemoveAll(p.dataDir); err != nil {
		return err
	}
	if err := os.MkdirAll(p.dataDir, 0o755); err != nil {
		return err
	}
	if err := c.startSupervised(ctx, j, f); err != nil {
		return errors.Join(errors.New("did not start on an empty data dir either"), err)
	}
	return nil
}

// refusesItsData reports whether a node's last log line refuses its
// own data dir (a store that does not open), not NATS.
func refusesItsData(line string) bool {
	return strings.Contains(line, "open store") || strings.Contains(line, "badger") || strings.Contains(line, "damaged")
}

func lastLine(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// clockOffsetEnv is telemetryd's test hook that moves its clock.
const clockOffsetEnv = "TELEMETRY_CLOCK_OFFSET"

// clockOffset restarts one node with its clock a minute ahead or behind
// (telemetryd's test hook: a Go program's clock cannot be moved from
// outside), holds it so, checks that it still sees every node (its
// view of the leases must not depend on its clock), and restarts it
// with the right time.
func (c *cluster) clockOffset(ctx context.Context, rng *rand.Rand, f *fault, hold time.Duration) error {
	j := rng.IntN(len(c.nodes))
	p := c.nodes[j]
	off := time.Minute
	if rng.IntN(2) == 0 {
		off = -off
	}
	f.What = fmt.Sprintf("%s restarted with its clock %s off", p.name, off)
	// Started again until ready, as a supervisor would: a NATS server
	// damaged by an earlier fault may still be electing its leaders.
	restart := func(env []string) error {
		p.stop(30 * time.Second)
		p.env = env
		return c.startSupervised(ctx, j, f)
	}
	if err := restart([]string{clockOffsetEnv + "=" + off.String()}); err != nil {
		return err
	}
	// Its view after a few renewals must hold every node that the
	// nodes with the right time see. Leases flicker on a loaded
	// cluster (a renewal late by a slow server), so it is read a few
	// times: a node counts as missed only if the skewed node saw it in
	// none of its reads while the others saw it in all of theirs (a
	// node another fault left down, or whose disk died, is seen by none
	// of them).
	sleepCtx(ctx, hold)
	const reads = 5
	var seen, others map[string]bool
	answered := 0
	for i := range reads {
		if i > 0 {
			sleepCtx(ctx, time.Second)
		}
		o := c.seenByOthers(ctx, j)
		if others == nil {
			others = o
		} else {
			maps.DeleteFunc(others, func(n string, _ bool) bool { return !o[n] })
		}
		v, err := getClusterView(ctx, c.client, c.urls[j])
		if err != nil {
			continue
		}
		answered++
		if seen == nil {
			seen = map[string]bool{}
		}
		for _, n := range v.Nodes {
			seen[n.Node] = true
		}
	}
	if answered == 0 {
		f.What += "; its view unreadable"
		return restart(nil)
	}
	var missed []string
	for _, name := range slices.Sorted(maps.Keys(others)) {
		if !seen[name] {
			missed = append(missed, name)
		}
	}
	f.What += fmt.Sprintf("; it saw %d of %d nodes over %d reads", len(seen), len(c.nodes), answered)
	if len(missed) > 0 {
		f.Violation = fmt.Sprintf("%s, its clock %s off, never saw %s, which the other nodes always saw", p.name, off, strings.Join(missed, ","))
	}
	return restart(nil)
}

// seenByOthers is the nodes that every node but j that answers sees
// in its view of the cluster (none when no other node answers).
func (c *cluster) seenByOthers(ctx context.Context, j int) map[string]bool {
	var seen map[string]bool
	for k := range c.nodes {
		if k == j {
			continue
		}
		v, err := getClusterView(ctx, c.client, c.urls[k])
		if err != nil {
			continue
		}
		here := map[string]bool{}
		for _, n := range v.Nodes {
			here[n.Node] = seen == nil || seen[n.Node]
		}
		seen = map[string]bool{}
		for n, ok := range here {
			if ok {
				seen[n] = true
			}
		}
	}
	return seen
}
