package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// Upgrading a cluster from the one stream to a stream per partition.
//
// Before streams per partition, a cluster kept every reading in one
// stream (the family's name, TELEMETRY) that stored <prefix>.<device> as
// <prefix>.<partition>.<device>, read by one durable consumer per node
// and partition (ConsumerName) filtered to its partition. Once the NATS
// servers map <prefix>.<device> to <prefix>.<partition>.<device>
// themselves, that stream (capturing <prefix>.*) receives nothing more;
// it may still hold messages some owner has not stored. So while it
// exists, each partition consumer also drains the partition from it with
// the consumer it had (or a new one, after the position saved for it,
// for a partition this node takes over): the partition counts as caught
// up only when both are settled. The store merges readings by device and
// time, so a reading in both streams (a publish retried across the
// switch) is stored once. RetireOldStream deletes the old stream once
// every partition's owners have settled it.

// upgradeEvery is how often a drain of the old stream looks whether the
// stream is gone.
const upgradeEvery = time.Second

// withUpgrade adds to c the drain of partition p of the old stream when
// that stream exists.
func (pc PartitionConsumers) withUpgrade(c *partitionConsumer, icfg ingest.Config, js jetstream.JetStream) (Consumer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	old, err := oldStreamConfig(ctx, js, icfg)
	if err != nil || old == nil {
		return c, err
	}
	drain, err := ingest.New(pc.NC, pc.Store, *old)
	if err != nil {
		return nil, err
	}
	log := icfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &upgradeConsumer{partitionConsumer: c, old: drain, js: js, stream: old.Stream,
		log: log.With("stream", old.Stream)}, nil
}

// oldStreamConfig is the configuration that drains icfg's partition
// from the old one stream, nil when there is none. The drain only reads
// the stream (Existing): it never changes its limits, and never creates
// it again once another node deleted it.
func oldStreamConfig(ctx context.Context, js jetstream.JetStream, icfg ingest.Config) (*ingest.Config, error) {
	family := icfg.Family()
	st, err := js.Stream(ctx, family)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", family, err)
	}
	have := st.CachedInfo().Config
	n, err := partition.Count(icfg.SubjectPrefix, have.SubjectTransform)
	if err != nil || n != icfg.Partitions {
		return nil, fmt.Errorf("stream %s of an earlier layout is not partitioned into %d (%v); drain it with -partitions it was made for first", family, icfg.Partitions, err)
	}
	c := icfg
	c.Stream, c.PartitionStreams, c.Intake, c.Existing = family, false, false, true
	c.StreamMaxBytes = max(c.StreamMaxBytes, have.MaxBytes)
	c.StreamMaxAge = max(c.StreamMaxAge, have.MaxAge)
	c.AtomicPublish = have.AllowAtomicPublish
	c.Replicas = have.Replicas
	return &c, nil
}

// upgradeConsumer is a partition's consumer of its own stream that also
// drains the partition from the old one stream until that is deleted.
type upgradeConsumer struct {
	*partitionConsumer
	old    *ingest.Ingester
	js     jetstream.JetStream
	stream string
	log    *slog.Logger

	mu      sync.Mutex
	oldGone bool
}

// Run consumes both streams until ctx is done; the old one's drain ends
// by itself once the stream is deleted.
func (u *upgradeConsumer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	oldCtx, stop := context.WithCancel(ctx)
	wg.Go(func() { u.drain(oldCtx) })
	err := u.partitionConsumer.Run(ctx)
	stop()
	wg.Wait()
	return err
}

// drain runs the old stream's ingester until ctx ends or the stream is
// gone.
func (u *upgradeConsumer) drain(ctx context.Context) {
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- u.old.Run(runCtx) }()
	t := time.NewTicker(upgradeEvery)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			if ctx.Err() == nil && !u.gone(ctx) {
				u.log.Error("draining the stream of an earlier layout stopped", "err", err)
			}
			return
		case <-t.C:
		}
		if u.gone(ctx) {
			stop()
			<-done
			u.log.Info("the stream of an earlier layout is gone; its partition was drained into the store")
			return
		}
	}
}

// gone reports (and remembers) whether the old stream was deleted.
func (u *upgradeConsumer) gone(ctx context.Context) bool {
	u.mu.Lock()
	g := u.oldGone
	u.mu.Unlock()
	if g {
		return true
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := u.js.Stream(cctx, u.stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		return false
	}
	u.mu.Lock()
	u.oldGone = true
	u.mu.Unlock()
	return true
}

// Backlog adds the old stream's unsettled messages of the partition
// while it exists: the partition is caught up only once both are.
func (u *upgradeConsumer) Backlog(ctx context.Context) (uint64, bool, error) {
	pending, passed, err := u.partitionConsumer.Backlog(ctx)
	if err != nil || u.gone(ctx) {
		return pending, passed, err
	}
	oldPending, oldPassed, err := u.old.Backlog(ctx)
	if err != nil {
		if u.gone(ctx) {
			return pending, passed, nil
		}
		return 0, false, fmt.Errorf("stream %s of an earlier layout: %w", u.stream, err)
	}
	// Caught up when both are (pending 0 or passed their start).
	both := (pending == 0 || passed) && (oldPending == 0 || oldPassed)
	return pending + oldPending, both, nil
}

// OldStream retires the old one stream of a cluster upgraded to
// streams per partition (see the top of this file). One node (the
// leader of the leases) calls Step now and then.
type OldStream struct {
	JS jetstream.JetStream
	// Family is the old stream's name (the family of the partition
	// streams).
	Family     string
	Partitions int
	// Owners is the nodes that should store partition p now, Live the
	// nodes with a live lease.
	Owners func(p int) []string
	Live   func() []string
	// Quiet is how long the stream must have received nothing before
	// it is deleted. Default 10s.
	Quiet  time.Duration
	Logger *slog.Logger
	Now    func() time.Time

	lastSeq   uint64
	stillFrom time.Time
	waiting   string
}

// Step deletes the old stream when it is settled: it received nothing
// for Quiet, every owner of every partition has its consumer there with
// nothing of the partition pending or unacked, and no consumer of a
// node that is down (it may own the partition again when it returns)
// has anything pending; a live node's consumer of a partition it no
// longer owns does not count. It reports whether the stream is gone.
func (o *OldStream) Step(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := o.JS.Stream(ctx, o.Family)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up stream %s: %w", o.Family, err)
	}
	now := o.now()
	last := st.CachedInfo().State.LastSeq
	if last != o.lastSeq || o.stillFrom.IsZero() {
		o.lastSeq, o.stillFrom = last, now
	}
	wait, err := o.unsettled(ctx, st)
	if err != nil {
		return false, err
	}
	if wait == "" && now.Sub(o.stillFrom) < o.quiet() {
		wait = fmt.Sprintf("it received a message less than %s ago", o.quiet())
	}
	if wait != "" {
		if wait != o.waiting {
			o.logger().Info("the stream of an earlier layout stays until it is settled", "stream", o.Family, "waiting_for", wait)
			o.waiting = wait
		}
		return false, nil
	}
	if err := o.JS.DeleteStream(ctx, o.Family); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, fmt.Errorf("delete stream %s: %w", o.Family, err)
	}
	o.logger().Info("the stream of an earlier layout is drained into every owner's store and deleted", "stream", o.Family,
		"last_seq", last)
	return true, nil
}

// unsettled names what the old stream's deletion waits for, "" when
// nothing.
func (o *OldStream) unsettled(ctx context.Context, st jetstream.Stream) (string, error) {
	infos := map[string]*jetstream.ConsumerInfo{}
	lister := st.ListConsumers(ctx)
	for ci := range lister.Info() {
		infos[ci.Name] = ci
	}
	if err := lister.Err(); err != nil {
		return "", fmt.Errorf("list consumers of %s: %w", o.Family, err)
	}
	live := map[string]bool{}
	for _, n := range o.Live() {
		live[n] = true
	}
	for name, ci := range infos {
		if ci.NumPending == 0 && ci.NumAckPending == 0 {
			continue
		}
		// A live node's consumer of a partition it does not own is a
		// leftover of a hand-over (its copy is not served); a node that
		// is down may own the partition again when it returns.
		if node, p, ok := parseConsumerName(name); ok && live[node] && !slices.Contains(o.Owners(p), node) {
			continue
		}
		return fmt.Sprintf("consumer %s (%d pending, %d unacked)", name, ci.NumPending, ci.NumAckPending), nil
	}
	for p := range o.Partitions {
		for _, node := range o.Owners(p) {
			if _, ok := infos[ConsumerName(node, p)]; !ok {
				return fmt.Sprintf("node %s to drain partition %d", node, p), nil
			}
		}
	}
	return "", nil
}

func (o *OldStream) quiet() time.Duration {
	if o.Quiet > 0 {
		return o.Quiet
	}
	return 10 * time.Second
}

func (o *OldStream) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

func (o *OldStream) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}

// parseConsumerName is the node and partition of a ConsumerName.
func parseConsumerName(name string) (node string, p int, ok bool) {
	rest, ok := strings.CutPrefix(name, "ingest-")
	i := strings.LastIndex(rest, "-p")
	if !ok || i <= 0 {
		return "", 0, false
	}
	p, err := strconv.Atoi(rest[i+2:])
	if err != nil || ConsumerName(rest[:i], p) != name {
		return "", 0, false
	}
	return rest[:i], p, true
}
