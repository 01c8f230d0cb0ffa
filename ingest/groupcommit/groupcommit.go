// Package groupcommit lets the ingesters of several streams share their
// store commits: the Write calls that arrive while one commit runs are
// committed together by the next, as one store Write (one Badger
// transaction per day table, and with fsync before ack one fsync),
// instead of one after the other under the day table's write lock.
//
// Each caller still returns only once its own readings are committed
// (or with the error that kept them out), so an ingester that acks
// after Write returns acks only what is stored. When a shared commit
// fails, every caller's readings are written again alone and each gets
// its own result: one caller's invalid or failing readings never fail
// another's.
package groupcommit

import (
	"context"
	"sync"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest"
)

// Group shares store commits between concurrent writers. Its zero
// value is not usable; create it with New. It is safe for concurrent
// use and needs no goroutine of its own: the caller whose Write finds
// no commit running leads, commits what is queued, and hands the lead
// to the first caller that queued meanwhile.
type Group struct {
	w ingest.Writer // the store

	mu    sync.Mutex
	queue []*request // waiting for the next commit
	busy  bool       // a caller leads
	buf   []buckets.Reading
}

// request is one Write call.
type request struct {
	rs    []buckets.Reading
	err   error
	lead  bool          // woken to lead the next commit, not with a result
	ready chan struct{} // closed once err is set or lead was given
}

// New returns a Group committing to w.
func New(w ingest.Writer) *Group { return &Group{w: w} }

var _ ingest.Writer = (*Group)(nil)

// Write commits rs, together with the readings of the Write calls
// queued at the same moment, and returns once rs is committed, or with
// the error of writing rs alone. Readings of one device in different
// calls merge in the order the calls were queued, as if the calls had
// run one after the other in that order. A shared commit runs on a
// context that the callers' cancellation does not end.
func (g *Group) Write(ctx context.Context, rs []buckets.Reading) error {
	if len(rs) == 0 {
		return nil
	}
	r := &request{rs: rs, ready: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, r)
	if g.busy {
		g.mu.Unlock()
		<-r.ready
		if !r.lead {
			return r.err
		}
		g.mu.Lock()
	}
	g.busy = true
	batch := g.queue
	g.queue = nil
	g.mu.Unlock()

	g.commit(context.WithoutCancel(ctx), r, batch)

	g.mu.Lock()
	if len(g.queue) > 0 {
		next := g.queue[0]
		next.lead = true
		close(next.ready)
	} else {
		g.busy = false
	}
	g.mu.Unlock()
	return r.err
}

// commit writes the readings of batch in one Write and settles every
// request of it; self, the leader, is settled without waking it. When
// the shared write fails, each request is written alone.
func (g *Group) commit(ctx context.Context, self *request, batch []*request) {
	settle := func(q *request, err error) {
		q.err = err
		if q != self {
			close(q.ready)
		}
	}
	if len(batch) == 1 {
		settle(batch[0], g.w.Write(ctx, batch[0].rs))
		return
	}
	// Only the leader touches buf: the lead passes under mu.
	all := g.buf[:0]
	for _, q := range batch {
		all = append(all, q.rs...)
	}
	err := g.w.Write(ctx, all)
	clear(all)
	g.buf = all[:0]
	if err == nil {
		for _, q := range batch {
			settle(q, nil)
		}
		return
	}
	// A shared write that failed may have committed some day tables
	// or chunks: writing the same readings again merges into the same
	// stored values.
	for _, q := range batch {
		settle(q, g.w.Write(ctx, q.rs))
	}
}

// Assign applies as directly: assignments are few (a device's
// attributes change rarely) and each caller's must be applied before
// its readings are written.
func (g *Group) Assign(ctx context.Context, as []buckets.Assignment) error {
	return g.w.Assign(ctx, as)
}
