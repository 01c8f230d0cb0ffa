package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/cmd/internal/exactlyonce"
)

// cluster is the run's processes on its network: NATS server i in
// namespace i, node j in namespace n+j (n servers).
type cluster struct {
	cfg    Config
	net    *network
	nats   []*proc
	nodes  []*proc
	urls   []string // the nodes' HTTP base URLs
	natsU  []string // the NATS servers' client URLs
	client *http.Client
	log    *slog.Logger
	lfs    []*lazyMount // per member, with power cuts: NATS server k's store, then node k's data dir (member servers+k)
	netem  bool         // the kernel has netem
	// diskMu keeps watchDisks off the LazyFS processes while a cut
	// mounts them again; diskHung are the members whose LazyFS it
	// killed as hung (diskCrashes says so).
	diskMu   sync.Mutex
	diskHung map[int]bool
}

// servers is the count of NATS servers and of nodes.
const servers = 3

// Run sets up the network and the cluster, publishes and queries while
// the faults of the schedule happen, heals everything and checks.
func Run(ctx context.Context, cfg Config, log *slog.Logger) (res Result, err error) {
	started := time.Now()
	defer func() { res.Elapsed = time.Since(started) }()
	// ctrl-C and SIGTERM end the run through ctx, so that every exit
	// tears down what it made (here too when a test binary runs it).
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := canMakeNamespaces(ctx); err != nil {
		return res, err
	}
	work, err := os.MkdirTemp(cfg.WorkDir, "telemetry-faults-")
	if err != nil {
		return res, err
	}
	res.WorkDir = work
	defer func() {
		if err == nil && res.OK() && !cfg.Keep {
			_ = os.RemoveAll(work)
		} else {
			log.Info("logs and data kept", "dir", work)
		}
	}()
	if cfg.Binary == "" {
		if cfg.Binary, err = buildService(ctx, work); err != nil {
			return res, err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return res, err
	}
	members := []string{"nats-0", "nats-1", "nats-2", "node-0", "node-1", "node-2"}
	net, err := newNetwork(ctx, members, log)
	if err != nil {
		return res, err
	}
	c := &cluster{cfg: cfg, net: net, log: log, client: &http.Client{Timeout: 5 * time.Second}, diskHung: map[int]bool{}}
	defer c.close()
	if err := c.setUp(ctx, self, work); err != nil {
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (set-up stopped: %w)", ctx.Err(), err)
		}
		return res, err
	}
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x7e1e))
	led := newLedger(cfg.Devices, cfg.Partitions)
	res.Seed = cfg.Seed

	runCtx, stopClients := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var nclients []*natsClient
	for i := range servers {
		urls := append([]string{c.natsU[i]}, slices.Delete(slices.Clone(c.natsU), i, i+1)...)
		nc := &natsClient{led: led, urls: urls, name: fmt.Sprintf("nats-%d", i), rate: cfg.Rate / 4,
			rng: rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i+1))), log: log}
		nclients = append(nclients, nc)
		wg.Go(func() {
			if err := nc.run(runCtx); err != nil {
				log.Error("publisher stopped", "client", nc.name, "err", err)
			}
		})
	}
	hw := &httpWriter{led: led, nodes: c.urls, rate: cfg.Rate / 4, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 99)),
		client: &http.Client{Timeout: 10 * time.Second}}
	wg.Go(func() { _ = hw.run(runCtx) })
	q := &querier{led: led, nodes: c.urls, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 100)), every: cfg.QueryEvery,
		staleBound: cfg.StaleBound, client: &http.Client{Timeout: 10 * time.Second}}
	wg.Go(func() { q.run(runCtx) })
	sv := &serving{nodes: c.urls, client: &http.Client{Timeout: time.Second}, every: time.Second}
	wg.Go(func() { sv.run(runCtx) })
	stopProgress := progress(runCtx, cfg.Progress, log, led)
	if cfg.LazyFS != "" {
		wg.Go(func() { c.watchDisks(runCtx) })
	}

	// A fault that fails is recorded and the cluster put back together
	// (faultLoop); only ctrl-C or SIGTERM ends the run without checks.
	ferr := c.faultLoop(ctx, rng, &res)
	if err := c.healAll(context.WithoutCancel(ctx)); err != nil {
		res.Incomplete = append(res.Incomplete, "heal after the last fault: "+err.Error())
	}
	// Publishing goes on for a while after the last heal, so the
	// healed cluster takes writes too.
	sleepCtx(ctx, cfg.Settle)
	stopClients()
	wg.Wait()
	stopProgress()
	res.Sent, res.Acked = led.counts()
	for _, nc := range nclients {
		res.PublishErrors += int(nc.errors.Load())
	}
	res.WriteErrors = int(hw.errors.Load())
	res.Queries = q.results()
	res.Writes = led.writes
	res.DoubleServed = sv.doubleServing(cfg.Partitions, cfg.Copies+1, cfg.LeaseTTL)
	res.Trailing = sv.trailingSeen()
	if err := errors.Join(ferr, ctx.Err()); err != nil {
		return res, err // stopped: what the clients saw, without the final check
	}
	c.finalCheck(ctx, led, &res)
	return res, nil
}

// setUp starts the NATS servers, waits for JetStream, then the nodes,
// and waits until every partition has its copies caught up.
func (c *cluster) setUp(ctx context.Context, self, work string) error {
	c.netem = c.net.hasNetem(ctx)
	for i := range servers {
		c.natsU = append(c.natsU, "nats://"+c.net.memberAddr(i)+":4222")
	}
	if c.cfg.LazyFS != "" {
		if err := c.mountAll(ctx, work); err != nil {
			return err
		}
	}
	for i := range servers {
		mapped := 0
		if c.cfg.PartitionStreams {
			mapped = c.cfg.Partitions
		}
		p, err := newNATSProc(c.net, self, i, servers, work, c.disk(work, i), mapped)
		if err != nil {
			return err
		}
		c.nats = append(c.nats, p)
		if err := p.start(); err != nil {
			return err
		}
	}
	if err := c.waitJetStream(ctx, 2*time.Minute); err != nil {
		return err
	}
	for j := range servers {
		p, err := newNodeProc(c.net, c.cfg, j, servers+j, joinURLs(c.natsU), work, c.disk(work, servers+j))
		if err != nil {
			return err
		}
		c.nodes = append(c.nodes, p)
		c.urls = append(c.urls, nodeURL(c.net, servers+j))
		// One at a time: the first creates the streams and buckets.
		if err := p.start(); err != nil {
			return err
		}
		if err := c.readyRepairing(ctx, j, 3*time.Minute); err != nil {
			return err
		}
	}
	return c.waitConverged(ctx, 3*time.Minute)
}

// disk is where member m (NATS server k is member k, node k member
// servers+k) keeps its data: under work, or on its LazyFS mount with
// power cuts.
func (c *cluster) disk(work string, m int) string {
	if c.cfg.LazyFS != "" {
		return c.lfs[m].mnt
	}
	return work
}

// waitJetStream waits until JetStream answers through every server.
func (c *cluster) waitJetStream(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for i, u := range c.natsU {
		for {
			err := func() error {
				nc, err := nats.Connect(u, nats.Timeout(time.Second))
				if err != nil {
					return err
				}
				defer nc.Close()
				js, err := jetstream.New(nc)
				if err != nil {
					return err
				}
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				_, err = js.AccountInfo(actx)
				return err
			}()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("JetStream not answering through nats-%d after %s: %w; log: %s", i, timeout, err, c.nats[i].lastLines(3))
			}
			sleepCtx(ctx, 300*time.Millisecond)
		}
	}
	return nil
}

// waitConverged waits until every node answers /v1/cluster with every
// node live and every partition caught up on its copies.
func (c *cluster) waitConverged(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if last = c.convergence(ctx); last == "" {
			return nil
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("cluster did not converge within %s: %s", timeout, last)
}

// convergence says what keeps the cluster from being converged, "" when
// nothing does.
func (c *cluster) convergence(ctx context.Context) string {
	for j, base := range c.urls {
		v, err := getClusterView(ctx, c.client, base)
		if err != nil {
			return err.Error()
		}
		if len(v.Nodes) != servers {
			return fmt.Sprintf("node-%d sees %d nodes", j, len(v.Nodes))
		}
		if len(v.Layout) != c.cfg.Partitions {
			return fmt.Sprintf("node-%d lists %d partitions", j, len(v.Layout))
		}
		for _, p := range v.Layout {
			for _, o := range p.Owners {
				if !slices.Contains(p.CaughtUp, o) {
					return fmt.Sprintf("node-%d: partition %d: owner %s not caught up (caught up: %v)", j, p.Partition, o, p.CaughtUp)
				}
			}
		}
	}
	return ""
}

// healAll removes every network fault, resumes every paused process and
// starts every process that is down.
func (c *cluster) healAll(ctx context.Context) error {
	err := c.net.heal(ctx)
	for _, p := range append(slices.Clone(c.nats), c.nodes...) {
		if p.running() {
			_ = p.signal(syscall.SIGCONT)
			continue
		}
		err = errors.Join(err, p.start())
	}
	return err
}

// finalCheck waits until the cluster converged and every acked reading
// is stored, then reads every device from each of its partition's
// owners (a caught-up owner answers from its own store) and judges it.
// What it cannot do (a node not ready, a read that fails) it records in
// res.Incomplete and goes on with the rest.
func (c *cluster) finalCheck(ctx context.Context, led *ledger, res *Result) {
	incomplete := func(format string, args ...any) {
		res.Incomplete = append(res.Incomplete, fmt.Sprintf(format, args...))
	}
	// A LazyFS that exited after the last fault (its process dies of
	// SIGBUS on its next write to a mapped file) takes its machine's
	// power first, as during the faults.
	if err := c.diskCrashes(ctx, res); err != nil {
		incomplete("final check: %v", err)
	}
	// The nodes at once: a stalled cluster must not cost each its wait.
	ready := make([]bool, len(c.nodes))
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for j := range c.nodes {
		wg.Go(func() { errs[j] = c.readyRepairing(ctx, j, 3*time.Minute) })
	}
	wg.Wait()
	res.Repairs = append(res.Repairs, c.operatorNotes()...)
	for j, err := range errs {
		if err != nil {
			incomplete("final check: %v", err)
			continue
		}
		ready[j] = true
	}
	if !slices.Contains(ready, true) {
		incomplete("final check: no node ready; no acked reading checked")
		res.Unchecked = led.devices * c.cfg.Copies
		return
	}
	converge := 5 * time.Minute
	if slices.Contains(ready, false) {
		converge = time.Minute // it cannot converge without every node; the layout is what counts
	}
	if err := c.waitConverged(ctx, converge); err != nil {
		incomplete("final check: %v", err)
	}
	owners := map[int][]string{}
	for j := range c.nodes {
		if !ready[j] {
			continue
		}
		v, err := getClusterView(ctx, c.client, c.urls[j])
		if err != nil {
			incomplete("final check: layout from node-%d: %v", j, err)
			continue
		}
		for _, p := range v.Layout {
			owners[p.Partition] = p.Owners
		}
		break
	}
	if len(owners) == 0 {
		incomplete("final check: no node told the layout; no acked reading checked")
		res.Unchecked = led.devices * c.cfg.Copies
		return
	}
	unread := map[string]int{}
	deadline := time.Now().Add(c.cfg.StoreWait)
	for d := range led.devices {
		p := led.partitionOf(d)
		for _, o := range owners[p] {
			j := slices.Index([]string{"node-0", "node-1", "node-2"}, o)
			if j < 0 || !ready[j] {
				unread[o]++
				res.Unchecked++
				continue
			}
			jd, err := c.readOwner(ctx, led, d, j, deadline)
			if err != nil {
				if unread[o] == 0 {
					incomplete("final check: read %s from %s: %v", deviceName(d), o, err)
				}
				unread[o]++
				res.Unchecked++
				continue
			}
			res.Checked++
			res.Lost += len(jd.missing)
			res.Duplicated += len(jd.duplicated)
			res.Misattributed += len(jd.misattributed)
			res.Unexpected += jd.unexpected
			for _, n := range head(jd.missing) {
				e, _ := led.get(n)
				res.Findings = append(res.Findings, fmt.Sprintf("lost: seq %d of %s (partition %d) acked %s via %s, not stored on owner %s",
					n, deviceName(d), p, e.acked.UTC().Format(time.RFC3339Nano), e.via, o))
			}
			for _, n := range head(jd.misattributed) {
				e, _ := led.get(n)
				res.Findings = append(res.Findings, fmt.Sprintf("misattributed: seq %d of %s stored under %s on %s", n, deviceName(e.dev), deviceName(d), o))
			}
		}
	}
	for _, o := range slices.Sorted(maps.Keys(unread)) {
		incomplete("final check: %d device copies on %s not read", unread[o], o)
	}
}

// readOwner reads device d from node j until every acked reading of it
// is there or deadline passes, and judges the last answer.
func (c *cluster) readOwner(ctx context.Context, led *ledger, d, j int, deadline time.Time) (judgement, error) {
	for {
		got, err := exactlyonce.ReadDevice(ctx, c.client, c.urls[j], deviceName(d), led.base, led.base.Add(24*time.Hour), nil)
		if err != nil {
			return judgement{}, err
		}
		jd := led.judge(d, got, time.Now())
		if len(jd.missing) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return jd, nil
		}
		sleepCtx(ctx, time.Second)
	}
}

// close stops every process and tears the network down; it runs on
// every exit, failures and ctrl-C included.
func (c *cluster) close() {
	for _, p := range c.nodes {
		p.stop(20 * time.Second)
	}
	for _, p := range c.nats {
		p.stop(20 * time.Second)
	}
	for _, m := range c.lfs {
		if m == nil { // a mount that was never made
			continue
		}
		if err := m.close(); err != nil {
			c.log.Error("lazyfs unmount", "err", err)
		}
	}
	_ = c.net.close()
}

// buildService compiles ./cmd/telemetryd into dir.
func buildService(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "telemetryd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/telemetryd/telemetryd/cmd/telemetryd")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build telemetryd: %w: %s", err, out)
	}
	return bin, nil
}

// progress logs what the clients did every interval until stopped.
func progress(ctx context.Context, every time.Duration, log *slog.Logger, led *ledger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick(ctx, every, func() {
			sent, acked := led.counts()
			log.Info("progress", "sent", sent, "acked", acked)
		})
	}()
	return func() { cancel(); <-done }
}

// tick runs f every interval until ctx ends.
func tick(ctx context.Context, every time.Duration, f func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}
