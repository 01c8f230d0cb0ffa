package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// Members is the cluster view this node follows (ownership.Membership).
type Members interface {
	// Wanted is the partitions this node should consume now.
	Wanted() []int
	// Changes signals (coalesced) when Wanted may have changed.
	Changes() <-chan struct{}
	// SetHolding records the partitions consumed and their messages not
	// yet settled; SetReady publishes the partitions answered and, of
	// those, the ones trailing their stream.
	SetHolding(ps []int, lag uint64)
	SetReady(ctx context.Context, ready, trailing []int) error
	// FreshElsewhere reports whether another node answers for p
	// without trailing its stream, by a lease written after since.
	FreshElsewhere(p int, since time.Time) bool
	// LeaseErr is nil while this node's lease is held.
	LeaseErr() error
	// Drops is the days dropped cluster-wide that a node should apply,
	// DroppedAt one of them (whether or not the drop went round yet),
	// RecordDrop records one (see Node.DropTable).
	Drops() map[buckets.Day]time.Time
	DroppedAt(day buckets.Day) (time.Time, bool)
	RecordDrop(ctx context.Context, day buckets.Day, at time.Time, done bool) error
	// Deletes, DeletedAt and RecordDelete are the same for devices
	// deleted cluster-wide (see Node.DeleteDevice).
	Deletes() map[buckets.DeviceID]time.Time
	DeletedAt(dev buckets.DeviceID) (time.Time, bool)
	RecordDelete(ctx context.Context, dev buckets.DeviceID, at time.Time, done bool) error
}

// Consumer is one partition's consumer (an *ingest.Ingester).
type Consumer interface {
	// Run consumes until ctx is done, then settles what it holds.
	Run(ctx context.Context) error
	// Ready is nil while the consumer is consuming.
	Ready() error
	// Backlog is how many messages of the partition are not settled,
	// and whether everything the stream held when the consumer started
	// is: it is caught up when either says so. It asks the server.
	Backlog(ctx context.Context) (pending uint64, passedStart bool, err error)
	// Position is the stream sequence up to which every message of the
	// partition is settled (the consumer's ack floor), and the sequence
	// of the partition's last message in the stream now. It asks the
	// server.
	Position(ctx context.Context) (applied, head uint64, err error)
	// StepDown asks the servers to move the consumer's leadership to
	// another of its replicas.
	StepDown(ctx context.Context) error
}

// Consumers makes partition consumers.
type Consumers interface {
	// Consumer returns a consumer of partition p, not yet running.
	Consumer(p int) (Consumer, error)
	// Remove deletes the durable consumer of a partition handed over
	// (its saved position stays, for a later take-over).
	Remove(ctx context.Context, p int) error
}

// Store is the local store as far as drops and deletes go
// (store.Store).
type Store interface {
	DroppedAt(day buckets.Day) (time.Time, bool)
	DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error)
	DeletedAt(dev buckets.DeviceID) (time.Time, bool)
	DeleteDeviceAt(ctx context.Context, dev buckets.DeviceID, at time.Time) (buckets.DeviceDelete, error)
}

// Dropper drops a day, or deletes a device, on every live node (the
// query router).
type Dropper interface {
	DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error)
	DeleteDevice(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error)
}

// Defaults of Config.
const (
	DefaultFollowEvery = 500 * time.Millisecond
	// DefaultCallTimeout bounds each call to the server of a Step.
	DefaultCallTimeout = 5 * time.Second
	// DefaultMaxReadLag is how far a caught-up partition's applied
	// position may trail the stream before the node stops answering
	// for it (Config.MaxReadLag).
	DefaultMaxReadLag = 10 * time.Second
)

// Config configures a Node. Members, Consumers and Store are required.
type Config struct {
	Members   Members
	Consumers Consumers
	Store     Store
	// Everywhere drops a day or deletes a device on every live node;
	// DropTable and DeleteDevice need it.
	Everywhere Dropper
	// Dropped is told of each day this node dropped because it was
	// dropped cluster-wide (for metrics); optional.
	Dropped func(ctx context.Context, d buckets.TableDrop)
	// Seed, when set, runs once a partition's consumer has caught up
	// and before the node answers for the partition: it brings what the
	// stream does not hold (the attributes set over HTTP) from an owner
	// that answers for it. While it fails the partition is not
	// answered, and it runs again at the next step.
	Seed func(ctx context.Context, p int) error
	// FollowEvery is how often Run steps without a change of the view.
	FollowEvery time.Duration
	// CallTimeout bounds each call to the server; default
	// DefaultCallTimeout.
	CallTimeout time.Duration
	// MaxReadLag bounds how stale a partition this node answers for may
	// be: when the consumer has not settled, for longer than this, the
	// messages the stream held at some moment (or the server could not
	// be asked for that long), the partition trails its stream. It is
	// then published as trailing, and withdrawn from the partitions the
	// node answers for as soon as another owner is seen answering it
	// without trailing, or this node's lease lapses, so queries go to
	// that owner (or fail with a 503 naming it) until the consumer is
	// back within the bound. When no owner answers it without trailing
	// (a NATS server's loss holds up every owner's consumer at once),
	// the trailing owners keep answering with what they have, asked
	// after any that does not trail. Default DefaultMaxReadLag.
	MaxReadLag time.Duration
	// Logger defaults to slog.Default(); Now to time.Now.
	Logger *slog.Logger
	Now    func() time.Time
}

// Node runs this node's partition consumers as the leases say.
type Node struct {
	cfg Config
	log *slog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	parts map[int]*running // by partition
}

// running is one partition's running consumer.
type running struct {
	c      Consumer
	cancel context.CancelFunc
	done   chan struct{}
	ready  bool   // caught up once; stays so
	lag    uint64 // unsettled messages when last asked
	// marks are the partition's last sequences the stream held at the
	// times the consumer was asked, oldest first, not yet settled;
	// fresh is the latest such time whose sequence is settled: every
	// message the stream held then is applied.
	marks []mark
	fresh time.Time
	stale bool      // trails its stream past MaxReadLag
	since time.Time // when it last began to trail
	out   bool      // withdrawn from the partitions answered (stale, and answered fresh elsewhere)
	// stuck is since when the consumer has had nothing pending and
	// made no progress while the stream held more (applied at stuckAt).
	stuck   time.Time
	stuckAt uint64
}

// mark is the partition's last stream sequence at a time.
type mark struct {
	at   time.Time
	head uint64
}

// settle records a position asked at now: applied up to applied, the
// stream's last message head. It updates fresh.
func (r *running) settle(now time.Time, applied, head uint64) {
	r.marks = append(r.marks, mark{at: now, head: head})
	i := 0
	for i < len(r.marks) && r.marks[i].head <= applied {
		r.fresh = r.marks[i].at
		i++
	}
	r.marks = r.marks[i:]
	// Bounded: while nothing settles, one mark per step at most; a
	// consumer that far behind is stale anyway, and the oldest marks
	// are the ones that matter.
	if len(r.marks) > maxMarks {
		r.marks = append(r.marks[:maxMarks/2], r.marks[len(r.marks)-maxMarks/2:]...)
	}
}

// trails reports whether the partition's copy trails its stream by
// more than bound at now: not every message the stream held bound ago
// is known to be applied.
func (r *running) trails(now time.Time, bound time.Duration) bool {
	return now.Sub(r.fresh) > bound
}

// behindSince is what a log says of the partition's freshness: when it
// was last known fresh, or that it has not been since it started.
func (r *running) behindSince() string {
	if r.fresh.IsZero() {
		return "not settled since it started"
	}
	return r.fresh.UTC().Format(time.RFC3339Nano)
}

// maxMarks bounds the marks kept per partition.
const maxMarks = 256

// New checks cfg and returns a Node; Start runs it.
func New(cfg Config) (*Node, error) {
	if cfg.Members == nil || cfg.Consumers == nil || cfg.Store == nil {
		return nil, errors.New("cluster: Members, Consumers and Store are required")
	}
	if cfg.FollowEvery <= 0 {
		cfg.FollowEvery = DefaultFollowEvery
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.MaxReadLag <= 0 {
		cfg.MaxReadLag = DefaultMaxReadLag
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Dropped == nil {
		cfg.Dropped = func(context.Context, buckets.TableDrop) {}
	}
	return &Node{cfg: cfg, log: cfg.Logger, parts: map[int]*running{}}, nil
}

// Start runs the reconcile loop until Close.
func (n *Node) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Go(func() { n.follow(ctx) })
}

// follow steps every FollowEvery and whenever the view changes.
func (n *Node) follow(ctx context.Context) {
	t := time.NewTicker(n.cfg.FollowEvery)
	defer t.Stop()
	for {
		n.Step(ctx)
		select {
		case <-ctx.Done():
			return
		case <-n.cfg.Members.Changes():
		case <-t.C:
		}
	}
}

// Step brings the consumers in line with Members once: it starts the
// wanted partitions' consumers, stops the others, checks the catch-up
// of those not yet caught up, applies the cluster-wide drops and
// publishes what it holds and what is ready. Run calls it; it is
// exported for tests and must not run twice at once.
func (n *Node) Step(ctx context.Context) {
	// Before any consumer starts: a node back from an outage, or
	// joining, applies the deletes it missed before it writes again.
	n.applyDeletes(ctx)
	want := n.cfg.Members.Wanted()
	n.mu.Lock()
	var start, stop []int
	for _, p := range want {
		if _, ok := n.parts[p]; !ok {
			start = append(start, p)
		}
	}
	for p := range n.parts {
		if !slices.Contains(want, p) {
			stop = append(stop, p)
		}
	}
	n.mu.Unlock()
	for _, p := range start {
		if err := n.start(p); err != nil {
			n.log.Error("start partition consumer", "partition", p, "err", err)
		}
	}
	for _, p := range stop {
		n.stop(ctx, p)
	}
	n.checkBacklogs(ctx)
	n.applyDrops(ctx)

	holding, ready, trailing, lag := n.answering()
	n.cfg.Members.SetHolding(holding, lag)
	rctx, cancel := context.WithTimeout(ctx, n.cfg.CallTimeout)
	defer cancel()
	if err := n.cfg.Members.SetReady(rctx, ready, trailing); err != nil && ctx.Err() == nil {
		n.log.Warn("publish caught-up partitions", "err", err)
	}
}

// answering works out, for Step, the partitions held, those answered
// (caught up, and not withdrawn) and of those the ones trailing their
// stream, and the unsettled messages of all held. A partition trailing
// its stream past MaxReadLag stays answered until another owner is seen
// answering it without trailing, by a lease written after this one
// began to trail, or until this node's lease lapses (Config.MaxReadLag).
func (n *Node) answering() (holding, ready, trailing []int, lag uint64) {
	leaseErr := n.cfg.Members.LeaseErr()
	n.mu.Lock()
	defer n.mu.Unlock()
	holding = slices.Sorted(maps.Keys(n.parts))
	now := n.cfg.Now()
	for _, p := range holding {
		r := n.parts[p]
		lag += r.lag
		if !r.ready {
			continue
		}
		stale := r.trails(now, n.cfg.MaxReadLag)
		if stale != r.stale {
			r.stale = stale
			if stale {
				r.since = now
				n.log.Warn("partition trails its stream", "partition", p,
					"behind_since", r.behindSince(), "max_read_lag", n.cfg.MaxReadLag)
			} else {
				n.log.Info("partition is back within the bound of its stream", "partition", p)
			}
		}
		out := stale && (leaseErr != nil || n.cfg.Members.FreshElsewhere(p, r.since))
		if out != r.out {
			r.out = out
			if out {
				n.log.Warn("partition withdrawn from queries: its consumer trails the stream, and another owner answers it without trailing (or this node's lease lapsed)",
					"partition", p, "behind_since", r.behindSince())
			} else {
				n.log.Info("partition answers queries again", "partition", p, "trailing", stale)
			}
		}
		if out {
			continue
		}
		ready = append(ready, p)
		if stale {
			trailing = append(trailing, p)
		}
	}
	return holding, ready, trailing, lag
}

// checkBacklogs asks each consumer how far behind it is, all at once
// and without the lock: each answer is a call to the server, which may
// hang as long as CallTimeout.
func (n *Node) checkBacklogs(ctx context.Context) {
	n.mu.Lock()
	parts := maps.Clone(n.parts)
	n.mu.Unlock()
	var wg sync.WaitGroup
	for p, r := range parts {
		wg.Go(func() { n.checkBacklog(ctx, p, r) })
	}
	wg.Wait()
}

// checkBacklog asks partition p's consumer for its backlog and its
// position. A consumer not set up yet, or a slow server, is asked again
// at the next step; meanwhile the partition's freshness ages.
func (n *Node) checkBacklog(ctx context.Context, p int, r *running) {
	at := n.cfg.Now()
	cctx, cancel := context.WithTimeout(ctx, n.cfg.CallTimeout)
	defer cancel()
	pending, passed, err := r.c.Backlog(cctx)
	if err != nil {
		return
	}
	applied, head, perr := r.c.Position(cctx)
	n.mu.Lock()
	caughtUp := !r.ready && (pending == 0 || passed)
	n.mu.Unlock()
	if caughtUp && n.cfg.Seed != nil {
		if err := n.cfg.Seed(ctx, p); err != nil {
			if ctx.Err() == nil {
				n.log.Warn("partition caught up, but what the stream does not hold could not be copied from another owner; it answers once it is",
					"partition", p, "err", err)
			}
			caughtUp = false
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.parts[p] != r { // stopped meanwhile
		return
	}
	r.lag = pending
	if caughtUp && !r.ready {
		// Fresh only as of a position settled below: an empty backlog
		// is the consumer leader's view, whose copy of the stream may
		// itself lag (its server just back from an outage), and the
		// start the ack floor passed may be long ago.
		r.ready, r.marks = true, nil
		n.log.Info("partition caught up", "partition", p)
	}
	if perr != nil {
		return
	}
	r.settle(at, applied, head)
	if !r.stalled(at, pending, applied, head) {
		return
	}
	// The consumer's leader serves a copy of the stream that lacks what
	// the stream's leader holds (a replica that fell behind in an outage
	// and did not catch up): nothing is delivered, and the copy stays
	// behind for good. Another replica may hold it all.
	n.log.Warn("partition consumer delivers nothing while its stream holds more; asking the servers to move its leader",
		"partition", p, "applied", applied, "stream_last", head, "since", r.stuck.UTC().Format(time.RFC3339Nano))
	r.stuck = time.Time{}
	go func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.cfg.CallTimeout)
		defer cancel()
		if err := r.c.StepDown(sctx); err != nil {
			n.log.Warn("move the partition consumer's leader", "partition", p, "err", err)
		}
	}()
}

// stalledAfter is how long a consumer may deliver nothing while its
// stream holds more before its leader is moved.
const stalledAfter = 20 * time.Second

// stalled records a position asked at now and reports whether the
// consumer has had nothing pending, and not moved its ack floor,
// while the stream held messages past it, for stalledAfter.
func (r *running) stalled(now time.Time, pending, applied, head uint64) bool {
	if pending > 0 || applied >= head || applied != r.stuckAt || r.stuck.IsZero() {
		r.stuckAt = applied
		r.stuck = time.Time{}
		if pending == 0 && applied < head {
			r.stuck = now
		}
		return false
	}
	return now.Sub(r.stuck) >= stalledAfter
}

// start runs a consumer for partition p.
func (n *Node) start(p int) error {
	c, err := n.cfg.Consumers.Consumer(p)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan struct{})}
	n.mu.Lock()
	n.parts[p] = r
	n.mu.Unlock()
	go func() {
		defer close(r.done)
		if err := c.Run(ctx); err != nil {
			n.log.Error("partition consumer stopped", "partition", p, "err", err)
		}
	}()
	n.log.Info("consuming partition", "partition", p)
	return nil
}

// stop ends the consumer of a partition this node no longer owns and
// removes its durable consumer; its saved position lets a later
// take-over resume where it stopped.
func (n *Node) stop(ctx context.Context, p int) {
	n.mu.Lock()
	r := n.parts[p]
	delete(n.parts, p)
	n.mu.Unlock()
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
	dctx, cancel := context.WithTimeout(ctx, n.cfg.CallTimeout)
	defer cancel()
	if err := n.cfg.Consumers.Remove(dctx, p); err != nil {
		n.log.Warn("delete the consumer of a partition handed over", "partition", p, "err", err)
	}
	n.log.Info("partition handed over", "partition", p)
}

// Close stops the loop and every partition consumer, each settling
// what it holds (their durable consumers stay, so a restart resumes
// them), waiting until ctx is done at most.
func (n *Node) Close(ctx context.Context) error {
	if n.cancel != nil {
		n.cancel()
	}
	n.wg.Wait()
	n.mu.Lock()
	parts := n.parts
	n.parts = map[int]*running{}
	n.mu.Unlock()
	var errs []error
	for _, r := range parts {
		r.cancel()
	}
	for _, p := range slices.Sorted(maps.Keys(parts)) {
		select {
		case <-parts[p].done:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("partition %d did not finish its batch: %w", p, ctx.Err()))
		}
	}
	return errors.Join(errs...)
}

// Ready reports whether this node can serve (/readyz): its lease is
// held, so the others count it, and every partition consumer it runs
// is consuming. A node catching up is ready: it answers queries for
// the partitions it has not caught up on through their other owners.
func (n *Node) Ready() error {
	if err := n.cfg.Members.LeaseErr(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range slices.Sorted(maps.Keys(n.parts)) {
		if err := n.parts[p].c.Ready(); err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
	}
	return nil
}

// Holding returns the partitions this node consumes and, of those, the
// ones it has caught up on and answers queries for (not withdrawn, see
// Config.MaxReadLag).
func (n *Node) Holding() (holding, ready []int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	holding = slices.Sorted(maps.Keys(n.parts))
	for _, p := range holding {
		if r := n.parts[p]; r.ready && !r.out {
			ready = append(ready, p)
		}
	}
	return holding, ready
}

// Serves reports whether this node answers reads of partition p now,
// by its own state: it consumes p, has caught up on it and has not
// withdrawn it as trailing its stream (what Holding lists as ready;
// see Config.MaxReadLag). The
// leases the other nodes read say the same, but later: a node that
// handed p back, or withdrew it, is still listed there until they read
// its next renewal, and it refuses their reads meanwhile.
func (n *Node) Serves(p int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.parts[p]
	return ok && r.ready && !r.out
}

// Trailing reports whether this node serves partition p (Serves) from
// a copy that trails its stream: answered all the same, since no other
// owner answers p without trailing (Config.MaxReadLag). Such answers
// may miss recent readings, and the API marks them partial. It is
// judged at the time of asking, not at the last step: a node whose
// process was paused answers its first queries before it steps again.
func (n *Node) Trailing(p int) bool {
	now := n.cfg.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.parts[p]
	return ok && r.ready && !r.out && (r.stale || r.trails(now, n.cfg.MaxReadLag))
}

// Consumers returns the running consumers by partition.
func (n *Node) Consumers() map[int]Consumer {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[int]Consumer, len(n.parts))
	for p, r := range n.parts {
		out[p] = r.c
	}
	return out
}
