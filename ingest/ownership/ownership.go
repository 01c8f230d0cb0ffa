// Package ownership decides which telemetryd nodes of a cluster own
// which partitions of the telemetry stream (deploy/CLUSTER.md), with leases in
// a JetStream key-value bucket.
//
// Every node holds a lease: the key nodes.<name> of the bucket, whose
// value (Lease, JSON) names the node's advertised URL, the partitions
// it consumes and those it has caught up on, and how far behind the
// stream it is. A node renews its lease every third of the lease TTL,
// and a lease older than the TTL is dead; its age is taken on
// the server's clock, which a node reckons from the timestamps of its
// own renewals, so a node whose clock is off agrees with the others. A node that stops
// cleanly deletes its lease, so the others take over at once.
//
// The owners of a partition are computed, not negotiated: from the live
// leases every node ranks the nodes for partition p by rendezvous
// hashing (highest FNV-1a 64 of "<node>/<p>") and the first Copies are
// its desired owners. Every node sees the same leases and computes the
// same owners; when a node joins, only the partitions it now ranks
// first or second for move (about Copies/nodes of them), and when one
// vanishes, only its partitions get a new owner.
//
// Handing over never leaves a partition with fewer answering copies
// than before: a node keeps consuming a partition it no longer owns
// until that many of its desired owners have published it as caught
// up. Queries go only to nodes that have published a partition as
// caught up (Owners). A view is as old as its last read of the leases:
// a node that has since handed a partition over or withdrawn it is
// still listed, and refuses the query itself (api/cluster), so the
// next owner is asked.
//
// The days dropped cluster-wide are recorded beside the leases (see
// drops.go), so that a node that missed a DELETE applies it later.
package ownership

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/buckets"
)

// Defaults of Config.
const (
	DefaultBucket   = "TELEMETRY_CLUSTER"
	DefaultLeaseTTL = 10 * time.Second
	DefaultCopies   = 2
	// MinLeaseTTL is the shortest lease accepted: renewals every third
	// of it must outrun the server's expiry checks.
	MinLeaseTTL = time.Second
	keyPrefix   = "nodes."
)

var nodeNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// ValidateNodeName checks a node name: it is a key token and part of
// consumer names, so letters, digits, '_' and '-' only, 1 to 64, not
// starting with '_' or '-'.
func ValidateNodeName(name string) error {
	if !nodeNameRE.MatchString(name) {
		return fmt.Errorf("node name %q: want 1 to 64 letters, digits, '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// Config configures a Membership.
type Config struct {
	// Bucket is the key-value bucket of the leases. Default
	// DefaultBucket.
	Bucket string
	// Node is this node's unique name (ValidateNodeName).
	Node string
	// URL is the HTTP base URL other nodes use to reach this one.
	URL string
	// Partitions is the partition count (at least 1).
	Partitions int
	// Copies is how many nodes own each partition. Default
	// DefaultCopies.
	Copies int
	// LeaseTTL is how long a lease lives without renewal. Default
	// DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Replicas of the bucket when this node creates it. Default 1
	// (the server's default); a cluster wants 3.
	Replicas int
	// Logger defaults to slog.Default(); Now to time.Now.
	Logger *slog.Logger
	Now    func() time.Time
}

// Lease is what a node publishes about itself, the value of its key
// (JSON):
//
//	{"node":"node-0","url":"http://node-0:8080","ready":[0,3,7],
//	 "trailing":[7],"holding":[0,3,7,9],"lag":120,"renewed":"2026-11-22T12:00:00Z"}
type Lease struct {
	Node string `json:"node"`
	URL  string `json:"url"`
	// Ready lists the partitions the node has caught up on, ascending:
	// the ones it answers queries for.
	Ready []int `json:"ready"`
	// Trailing lists the partitions of Ready whose consumer trails the
	// stream past the node's bound, ascending: the node answers them
	// only while no other node answers them without trailing (see
	// FreshElsewhere), and is asked after the owners that do not trail.
	Trailing []int `json:"trailing,omitempty"`
	// Holding lists the partitions the node consumes, ascending: Ready
	// and those it is catching up on.
	Holding []int `json:"holding,omitempty"`
	// Lag is how many messages of its partitions the node had not
	// settled (not yet delivered, or delivered and not yet acked) when
	// it last looked, summed over Holding.
	Lag uint64 `json:"lag"`
	// Renewed is when the lease was last written (the bucket's own
	// timestamp decides expiry; this is for people). In the view of a
	// node (Nodes) it is the bucket's timestamp on that node's clock.
	Renewed time.Time `json:"renewed"`
}

// KV is the part of a JetStream key-value bucket the leases and the
// drops are kept in (jetstream.KeyValue has it).
type KV interface {
	Put(ctx context.Context, key string, value []byte) (uint64, error)
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Keys(ctx context.Context, opts ...jetstream.WatchOpt) ([]string, error)
	Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error
}

var _ KV = jetstream.KeyValue(nil)

// Peer is a node that can answer for a partition.
type Peer struct {
	Node string
	URL  string
	Self bool
}

// Membership keeps this node's lease and the view of the others.
type Membership struct {
	cfg Config
	js  jetstream.JetStream
	log *slog.Logger

	changed chan struct{}

	mu       sync.Mutex
	kv       KV
	live     map[string]Lease // by node, this node included once it holds its lease
	ready    []int            // this node's caught-up partitions
	trailing []int            // those of ready that trail their stream
	holding  map[int]bool     // partitions this node consumes now
	lag      uint64           // this node's unsettled messages
	renewed  time.Time        // when this node's lease was last written
	renewErr error            // why the last renewal failed; nil when it did not
	// The server's clock as this node reckons it: the lease's last
	// put (revision, local time half-way through the call), and the
	// server's time minus this node's, learnt from that put's entry.
	putRev    uint64
	putAt     time.Time
	skew      time.Duration
	dropsKV   KV
	drops     map[buckets.Day]drop      // days dropped cluster-wide (drops.go)
	deletes   map[buckets.DeviceID]drop // devices deleted cluster-wide (deletes.go)
	lastDrops time.Time                 // when drops were last read
}

// New checks cfg and returns a Membership on js; Open creates its
// buckets and Run keeps it.
func New(js jetstream.JetStream, cfg Config) (*Membership, error) {
	if js == nil {
		return nil, errors.New("ownership: nil JetStream")
	}
	return newMembership(js, cfg)
}

// NewOn returns a Membership on buckets that exist already: leases
// (with the lease TTL) and drops. Open takes the lease.
func NewOn(leases, drops KV, cfg Config) (*Membership, error) {
	if leases == nil || drops == nil {
		return nil, errors.New("ownership: nil bucket")
	}
	m, err := newMembership(nil, cfg)
	if err != nil {
		return nil, err
	}
	m.kv, m.dropsKV = leases, drops
	return m, nil
}

func newMembership(js jetstream.JetStream, cfg Config) (*Membership, error) {
	cfg.Bucket = cmp.Or(cfg.Bucket, DefaultBucket)
	cfg.Copies = cmp.Or(cfg.Copies, DefaultCopies)
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, DefaultLeaseTTL)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	switch {
	case cfg.Partitions < 1:
		return nil, fmt.Errorf("ownership: partitions %d: want at least 1", cfg.Partitions)
	case cfg.Copies < 1:
		return nil, fmt.Errorf("ownership: copies %d: want at least 1", cfg.Copies)
	case cfg.LeaseTTL < MinLeaseTTL:
		return nil, fmt.Errorf("ownership: lease TTL %s: want at least %s", cfg.LeaseTTL, MinLeaseTTL)
	case cfg.URL == "":
		return nil, errors.New("ownership: empty advertise URL")
	}
	if err := ValidateNodeName(cfg.Node); err != nil {
		return nil, fmt.Errorf("ownership: %w", err)
	}
	return &Membership{
		cfg: cfg, js: js, log: cfg.Logger,
		changed: make(chan struct{}, 1),
		live:    map[string]Lease{},
		holding: map[int]bool{},
		drops:   map[buckets.Day]drop{},
	}, nil
}

// bucketMaxBytes bounds each of the two buckets: only the service
// writes them, one small entry per node or dropped day, so a bucket
// this full is a fault; a put past it fails (buckets discard new).
const bucketMaxBytes = 64 << 20

// Open creates (or opens) the bucket and takes this node's lease. A
// live lease of the same name held by another process is refused:
// two nodes of one name would each believe the other's partitions are
// theirs.
func (m *Membership) Open(ctx context.Context) error {
	if m.js != nil {
		// No TTL (the stream's MaxAge): a dead lease is told by its
		// age, and the server need not remove it. With one, every
		// entry of a bucket whose servers were all down for longer than
		// the TTL (a power cut of every machine) is expired when they
		// start again, while the replicated log still holds them: each
		// replica waited for a leader to catch it up, none became one,
		// and no node could open the bucket again (the fault harness,
		// cmd/telemetry-faults, on LazyFS). A bucket made with a TTL
		// loses it here.
		kv, err := m.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      m.cfg.Bucket,
			Description: "telemetryd node leases: advertised URL and caught-up partitions",
			History:     1,
			MaxBytes:    bucketMaxBytes,
			Storage:     jetstream.FileStorage,
			Replicas:    m.cfg.Replicas,
		})
		if err != nil {
			return fmt.Errorf("ownership: bucket %s: %w", m.cfg.Bucket, err)
		}
		m.mu.Lock()
		m.kv = kv
		m.mu.Unlock()
	}
	kv := m.kv
	if e, err := kv.Get(ctx, keyPrefix+m.cfg.Node); err == nil && m.alive(e) {
		var l Lease
		if json.Unmarshal(e.Value(), &l) == nil && l.URL != m.cfg.URL {
			return fmt.Errorf("ownership: node name %s is held by a live node at %s (lease renewed %s ago); names must be unique",
				m.cfg.Node, l.URL, m.serverNow().Sub(e.Created()).Round(time.Millisecond))
		}
	}
	if err := m.renew(ctx); err != nil {
		return err
	}
	if err := m.openDrops(ctx); err != nil {
		return err
	}
	return m.refresh(ctx)
}

// dropsEvery is how often the cluster-wide drops are read again.
const dropsEvery = 10 * time.Second

// Run renews the lease and refreshes the view every third of the lease
// TTL (Sync) until ctx is done, then deletes the lease.
func (m *Membership) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			m.Leave(context.WithoutCancel(ctx))
			return
		case <-t.C:
		}
		m.Sync(ctx)
	}
}

// Leave deletes this node's lease, so the others take its partitions
// over at once.
func (m *Membership) Leave(ctx context.Context) {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := m.kv.Delete(dctx, keyPrefix+m.cfg.Node); err != nil {
		m.log.Warn("delete lease", "node", m.cfg.Node, "err", err)
	}
}

// Sync renews the lease, reads the others' and, every dropsEvery, the
// cluster-wide drops. Each step may take up to half the TTL: a slow
// server delays a renewal rather than failing it, and the next one
// follows. Failures are logged; LeaseErr reports a lease that lapsed.
func (m *Membership) Sync(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, m.cfg.LeaseTTL/2)
	if err := m.renew(rctx); err != nil && ctx.Err() == nil {
		m.log.Warn("renew lease", "node", m.cfg.Node, "err", err)
	}
	cancel()
	rctx, cancel = context.WithTimeout(ctx, m.cfg.LeaseTTL/2)
	if err := m.refresh(rctx); err != nil && ctx.Err() == nil {
		m.log.Warn("read leases", "err", err)
	}
	cancel()
	m.mu.Lock()
	due := m.cfg.Now().Sub(m.lastDrops) >= dropsEvery
	m.mu.Unlock()
	if due {
		rctx, cancel = context.WithTimeout(ctx, m.cfg.LeaseTTL/2)
		if err := m.readDrops(rctx); err != nil && ctx.Err() == nil {
			m.log.Warn("read cluster-wide drops", "err", err)
		}
		cancel()
	}
}

// LeaseErr is nil while this node's lease is held: written less than
// the lease TTL ago. Otherwise the other nodes no longer count this
// one, and the error says why.
func (m *Membership) LeaseErr() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if age := m.cfg.Now().Sub(m.renewed); m.renewed.IsZero() || age >= m.cfg.LeaseTTL {
		if m.renewErr != nil {
			return fmt.Errorf("cluster lease not renewed for %s: %w", age.Round(time.Millisecond), m.renewErr)
		}
		return fmt.Errorf("cluster lease not renewed for %s", age.Round(time.Millisecond))
	}
	return nil
}

// Changes signals (coalesced) when the view or this node's readiness
// changed: the consumer should compare Wanted with what it consumes.
func (m *Membership) Changes() <-chan struct{} { return m.changed }

func (m *Membership) notify() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// renew writes this node's lease.
func (m *Membership) renew(ctx context.Context) error {
	m.mu.Lock()
	now := m.cfg.Now()
	l := m.ownLease()
	l.Renewed = now.UTC()
	m.mu.Unlock()
	b, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("ownership: encode lease: %w", err)
	}
	rev, err := m.kv.Put(ctx, keyPrefix+m.cfg.Node, b)
	after := m.cfg.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.renewErr = err
		return fmt.Errorf("ownership: renew lease %s: %w", m.cfg.Node, err)
	}
	m.renewed, m.renewErr = now, nil
	m.putRev, m.putAt = rev, now.Add(after.Sub(now)/2)
	return nil
}

// learnSkew sets the server's clock against this node's from the entry
// of this node's lease: its timestamp is the server's when it stored
// the put that returned putRev.
func (m *Membership) learnSkew(e jetstream.KeyValueEntry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.Revision() == m.putRev && !m.putAt.IsZero() {
		m.skew = e.Created().Sub(m.putAt)
	}
}

func (m *Membership) skewNow() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.skew
}

// ServerNow is the servers' time now as this node reckons it: the clock
// of the bucket entries' timestamps.
func (m *Membership) ServerNow() time.Time { return m.serverNow() }

// serverNow is the server's time now as this node reckons it.
func (m *Membership) serverNow() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cfg.Now().Add(m.skew)
}

// ownLease is this node's lease as it stands (m.mu held), Renewed unset.
func (m *Membership) ownLease() Lease {
	return Lease{Node: m.cfg.Node, URL: m.cfg.URL, Ready: slices.Clone(m.ready), Trailing: slices.Clone(m.trailing),
		Holding: slices.Sorted(maps.Keys(m.holding)), Lag: m.lag}
}

// alive reports whether a lease entry is younger than the TTL. Its age
// is measured on the server's clock (the entry's timestamp is the
// server's), so a node whose clock is off, by a minute or a day, sees
// the same live nodes as the others. Before this node's first renewal
// it has only its own clock.
func (m *Membership) alive(e jetstream.KeyValueEntry) bool {
	return e.Operation() == jetstream.KeyValuePut && m.serverNow().Sub(e.Created()) < m.cfg.LeaseTTL
}

// refresh reads every live lease.
func (m *Membership) refresh(ctx context.Context) error {
	keys, err := m.kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return fmt.Errorf("ownership: list leases: %w", err)
	}
	// This node's own lease first: it tells the server's clock.
	own := keyPrefix + m.cfg.Node
	slices.SortStableFunc(keys, func(a, b string) int { return boolRank(b == own) - boolRank(a == own) })
	live := map[string]Lease{}
	for _, k := range keys {
		e, err := m.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("ownership: read lease %s: %w", k, err)
		}
		if k == own {
			m.learnSkew(e)
		}
		var l Lease
		if err := json.Unmarshal(e.Value(), &l); err != nil || !m.alive(e) || keyPrefix+l.Node != k {
			continue
		}
		// Renewed as this node's clock has it (the server's timestamp
		// moved by the skew): the nodes' own clocks may differ.
		l.Renewed = e.Created().Add(-m.skewNow()).UTC()
		live[l.Node] = l
	}
	m.mu.Lock()
	// Our own lease is live by definition, and as it stands now.
	self := m.ownLease()
	self.Renewed = live[m.cfg.Node].Renewed
	live[m.cfg.Node] = self
	changed := !sameView(m.live, live)
	m.live = live
	m.mu.Unlock()
	if changed {
		m.log.Info("cluster view changed", "nodes", slices.Sorted(maps.Keys(live)))
		m.notify()
	}
	return nil
}

// SetReady records the partitions this node answers queries for and,
// of those, the ones whose consumer trails the stream, and publishes
// them with a lease renewal when they changed.
func (m *Membership) SetReady(ctx context.Context, ready, trailing []int) error {
	ready = slices.Sorted(slices.Values(ready))
	trailing = slices.Sorted(slices.Values(trailing))
	m.mu.Lock()
	same := slices.Equal(ready, m.ready) && slices.Equal(trailing, m.trailing)
	m.ready, m.trailing = ready, trailing
	if l, ok := m.live[m.cfg.Node]; ok {
		l.Ready, l.Trailing = slices.Clone(ready), slices.Clone(trailing)
		m.live[m.cfg.Node] = l
	}
	m.mu.Unlock()
	if same {
		return nil
	}
	m.notify()
	return m.renew(ctx)
}

// SetHolding records the partitions this node consumes now and how
// many of their messages it has not settled; Wanted keeps them until
// their new owners caught up. The next renewal publishes both.
func (m *Membership) SetHolding(ps []int, lag uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.holding = map[int]bool{}
	for _, p := range ps {
		m.holding[p] = true
	}
	m.lag = lag
	if l, ok := m.live[m.cfg.Node]; ok {
		l.Holding, l.Lag = slices.Sorted(maps.Keys(m.holding)), lag
		m.live[m.cfg.Node] = l
	}
}

// Wanted returns the partitions this node should consume: those it is
// a desired owner of, and those it consumes now whose desired owners
// have not all caught up yet.
func (m *Membership) Wanted() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int
	for p := range m.cfg.Partitions {
		owners := m.desired(p)
		if slices.Contains(owners, m.cfg.Node) {
			out = append(out, p)
			continue
		}
		if m.holding[p] && m.readyCount(p, owners) < len(owners) {
			out = append(out, p)
		}
	}
	return out
}

// Desired returns the desired owners of p among the live nodes, best
// ranked first.
func (m *Membership) Desired(p int) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.desired(p)
}

func (m *Membership) desired(p int) []string {
	names := slices.Collect(maps.Keys(m.live))
	return Rank(names, p)[:min(m.cfg.Copies, len(names))]
}

func (m *Membership) readyCount(p int, nodes []string) int {
	n := 0
	for _, name := range nodes {
		if slices.Contains(m.live[name].Ready, p) {
			n++
		}
	}
	return n
}

// Owners returns the live nodes that have caught up on p, in the order
// to ask them: those that do not trail its stream before those that do,
// and within each this node first, then the desired owners by rank,
// then any other (a node still handing p over). Empty when no node
// answers for p yet.
func (m *Membership) Owners(p int) []Peer {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := Rank(slices.Collect(maps.Keys(m.live)), p)
	slices.SortStableFunc(names, func(a, b string) int {
		ta, tb := slices.Contains(m.live[a].Trailing, p), slices.Contains(m.live[b].Trailing, p)
		if c := boolRank(ta) - boolRank(tb); c != 0 {
			return c
		}
		return boolRank(b == m.cfg.Node) - boolRank(a == m.cfg.Node)
	})
	var out []Peer
	for _, name := range names {
		l := m.live[name]
		if slices.Contains(l.Ready, p) {
			out = append(out, Peer{Node: name, URL: l.URL, Self: name == m.cfg.Node})
		}
	}
	return out
}

// FreshElsewhere reports whether another live node answers for p
// without trailing its stream, by a lease of it written after since
// (on this node's clock). A node whose own consumer of p trails keeps
// answering for p until this holds: when a NATS server goes away, every
// owner's consumer of p may trail at once, and each then sees the
// others' leases written after it started trailing list p as trailing
// too (or not at all), so they do not all withdraw it.
func (m *Membership) FreshElsewhere(p int, since time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, l := range m.live {
		if name != m.cfg.Node && l.Renewed.After(since) && slices.Contains(l.Ready, p) && !slices.Contains(l.Trailing, p) {
			return true
		}
	}
	return false
}

// Nodes returns the live leases, by node name.
func (m *Membership) Nodes() []Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Lease, 0, len(m.live))
	for _, name := range slices.Sorted(maps.Keys(m.live)) {
		l := m.live[name]
		l.Ready, l.Trailing, l.Holding = slices.Clone(l.Ready), slices.Clone(l.Trailing), slices.Clone(l.Holding)
		out = append(out, l)
	}
	return out
}

// Copies is how many nodes own each partition.
func (m *Membership) Copies() int { return m.cfg.Copies }

// Node is this node's name.
func (m *Membership) Node() string { return m.cfg.Node }

// Partitions is the partition count.
func (m *Membership) Partitions() int { return m.cfg.Partitions }

// Rank orders nodes for partition p by rendezvous hashing, best first:
// descending FNV-1a 64 of "<node>/<p>", ties by name.
func Rank(nodes []string, p int) []string {
	type scored struct {
		name  string
		score uint64
	}
	s := make([]scored, len(nodes))
	for i, n := range nodes {
		h := fnv.New64a()
		_, _ = h.Write([]byte(n + "/" + strconv.Itoa(p)))
		s[i] = scored{n, mix(h.Sum64())}
	}
	slices.SortFunc(s, func(a, b scored) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = x.name
	}
	return out
}

// mix spreads FNV's output (whose high bits barely depend on the last
// bytes hashed) so that nodes differing in one character rank apart.
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sameView reports whether two views hold the same nodes, URLs, ready
// and trailing partitions.
func sameView(a, b map[string]Lease) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		y, ok := b[k]
		if !ok || x.URL != y.URL || !slices.Equal(x.Ready, y.Ready) || !slices.Equal(x.Trailing, y.Trailing) {
			return false
		}
	}
	return true
}
