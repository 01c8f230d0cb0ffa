package alerting

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is what the evaluator needs of a cluster's membership.
type Cluster struct {
	// Self is this node's name.
	Self string
	// Nodes returns the nodes that hold a lease, each with when it last
	// renewed it (by its own clock).
	Nodes func() map[string]time.Time
	// LeaseErr is nil while this node's own lease is held.
	LeaseErr func() error
	// LeaseTTL is how long a node's lease lives without renewal.
	LeaseTTL time.Duration
	// ServerNow is the NATS servers' clock as this node reckons it:
	// the clock of the bucket entries' timestamps. Nil: this node's.
	ServerNow func() time.Time
}

// groupLeases gives each rule group to one node of a cluster at a time.
//
// The group's preferred node is the live node that ranks highest for its
// name (rendezvous hashing over the node leases), so groups spread over
// the nodes and move only when a node comes or goes. Nodes' views of who
// is live differ for a moment when one joins, so the preferred node also
// takes the group's entry in the state bucket by compare-and-set before
// each evaluation: it takes it when the entry is free, its own, held by
// a node whose lease has lapsed, or not renewed for staleAfter; a node
// that is no longer preferred lets its entry go. Two nodes can
// therefore not evaluate a group in the same interval, and a killed
// node's groups are taken over at the first evaluation after its lease
// lapsed (within the lease TTL plus one interval of its last renewal).
type groupLeases struct {
	kv  jetstream.KeyValue
	c   Cluster
	now func() time.Time
	log *slog.Logger
	// staleAfter is how long an entry of a live node that no longer
	// renews it (a group it no longer has) keeps the group from others.
	staleAfter time.Duration

	// mu guards held and lastErr; the bucket is never called with it
	// held (one group's Held calls come one at a time).
	mu      sync.Mutex
	held    map[string]uint64 // group → revision of this node's entry
	lastErr string
}

func (l *groupLeases) heldRev(group string) (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rev, ok := l.held[group]
	return rev, ok
}

func (l *groupLeases) setHeld(group string, rev uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held[group] = rev
	l.lastErr = ""
}

func (l *groupLeases) dropHeld(group string) (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rev, ok := l.held[group]
	delete(l.held, group)
	return rev, ok
}

// leaseRecord is a group's entry in the state bucket.
type leaseRecord struct {
	Node string    `json:"node"`
	At   time.Time `json:"at"`
}

func leaseKey(group string) string { return "lease." + hex.EncodeToString([]byte(group)) }

func newGroupLeases(kv jetstream.KeyValue, c Cluster, now func() time.Time, log *slog.Logger) *groupLeases {
	return &groupLeases{kv: kv, c: c, now: now, log: log, staleAfter: max(10*c.LeaseTTL, time.Minute),
		held: map[string]uint64{}}
}

// live returns the nodes whose lease is younger than the TTL now, this
// node only while its own lease is held.
func (l *groupLeases) live(now time.Time) map[string]bool {
	out := map[string]bool{}
	for n, renewed := range l.c.Nodes() {
		if n == l.c.Self {
			continue
		}
		if now.Sub(renewed) < l.c.LeaseTTL {
			out[n] = true
		}
	}
	if l.c.LeaseErr() == nil {
		out[l.c.Self] = true
	}
	return out
}

// preferred is the live node that ranks highest for group.
func preferred(live map[string]bool, group string) string {
	best, bestScore := "", uint64(0)
	for n := range live {
		h := fnv.New64a()
		h.Write([]byte(n))
		h.Write([]byte{0})
		h.Write([]byte(group))
		if s := mix(h.Sum64()); best == "" || s > bestScore || (s == bestScore && n > best) {
			best, bestScore = n, s
		}
	}
	return best
}

// mix spreads the bits of an FNV hash (MurmurHash3's finaliser): FNV
// alone ranks names that differ in one character (node-1, node-2) in the
// same order for most groups.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// Held says whether this node evaluates group now, renewing or taking
// its entry when it should (rules.Config.Lease).
func (l *groupLeases) Held(group string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), max(l.c.LeaseTTL/2, time.Second))
	defer cancel()
	now := l.now()
	live := l.live(now)
	if preferred(live, group) != l.c.Self {
		l.release(ctx, group)
		return false
	}
	k := leaseKey(group)
	b, err := json.Marshal(leaseRecord{Node: l.c.Self, At: now.UTC()})
	if err != nil {
		return false
	}
	if rev, ok := l.heldRev(group); ok {
		if next, err := l.kv.Update(ctx, k, b, rev); err == nil {
			l.setHeld(group, next)
			return true
		}
		l.dropHeld(group)
	}
	var rev uint64
	e, err := l.kv.Get(ctx, k)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		l.failed(group, err)
		return false
	default:
		var r leaseRecord
		if json.Unmarshal(e.Value(), &r) == nil && r.Node != l.c.Self && l.taken(r, e, live, now) {
			return false
		}
		rev = e.Revision()
	}
	var next uint64
	if rev == 0 {
		next, err = l.kv.Create(ctx, k, b)
	} else {
		next, err = l.kv.Update(ctx, k, b, rev)
	}
	if err != nil {
		// Another node took it first, or the bucket did not answer.
		if !isWrongSequence(err) {
			l.failed(group, err)
		}
		return false
	}
	l.setHeld(group, next)
	return true
}

// taken says whether another node's entry r still keeps the group: its
// holder is live and has not let it go yet, or this node does not see
// the holder live but the holder renewed the entry within the lease TTL
// (a node that has just started sees no other node yet; without this it
// took the group from a holder that had evaluated it in the same
// interval). The entry's age is measured on the servers' clock, so a
// holder whose clock is off is not taken for dead.
func (l *groupLeases) taken(r leaseRecord, e jetstream.KeyValueEntry, live map[string]bool, now time.Time) bool {
	if live[r.Node] {
		return now.Sub(r.At) < l.staleAfter
	}
	serverNow := now
	if l.c.ServerNow != nil {
		serverNow = l.c.ServerNow()
	}
	return serverNow.Sub(e.Created()) < l.c.LeaseTTL
}

// isWrongSequence says whether err is a lost compare-and-set.
func isWrongSequence(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// release lets group's entry go if this node holds it.
func (l *groupLeases) release(ctx context.Context, group string) {
	rev, ok := l.dropHeld(group)
	if !ok {
		return
	}
	if err := l.kv.Delete(ctx, leaseKey(group), jetstream.LastRevision(rev)); err != nil && !isWrongSequence(err) {
		l.failed(group, err)
	}
}

// Release lets the entries of groups go (groups removed by a reload).
func (l *groupLeases) Release(groups ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, g := range groups {
		l.release(ctx, g)
	}
}

// ReleaseAll lets every entry this node holds go (a clean stop), so the
// next node need not wait for this node's lease to lapse.
func (l *groupLeases) ReleaseAll() {
	l.mu.Lock()
	var gs []string
	for g := range l.held {
		gs = append(gs, g)
	}
	l.mu.Unlock()
	l.Release(gs...)
}

// failed logs a bucket error once until the bucket answers again.
func (l *groupLeases) failed(group string, err error) {
	l.mu.Lock()
	s := err.Error()
	again := s == l.lastErr
	l.lastErr = s
	l.mu.Unlock()
	if !again {
		l.log.Warn("rule group lease: the state bucket did not answer; the group is not evaluated here meanwhile", "group", group, "err", err)
	}
}
