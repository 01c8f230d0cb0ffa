package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Leader spread. Each partition's stream is a raft group of its own
// whose leader takes every write of the partition; the servers elect
// the leaders without regard to how many each already leads, so after a
// start or a server's return one server can lead most of them and take
// most of the fleet's writes. Balance evens them out: while some
// server leads more than ceil(P/S) of the P streams (S the servers
// that hold replicas), it asks the leader of one of them to step down
// in favour of a replica that leads fewer (the stream leader stepdown
// API with a preferred placement, nats-server 2.11 and later). A
// stepdown hands the leadership to a replica that is current, so no
// acked message is lost; a publish in flight during it fails and the
// client retries.

// StreamLeader is one stream's leader and replicas, as the servers
// report it.
type StreamLeader struct {
	Stream string `json:"stream"`
	// Leader is the server that leads the stream ("" while none does).
	Leader string `json:"leader"`
	// Replicas is the other servers holding the stream, by name.
	Replicas []string `json:"replicas"`
	// Current lists the replicas that are current (not offline or
	// behind): a stepdown can hand the leadership only to those.
	Current []string `json:"-"`
}

// Leaders reads the leader and replicas of each named stream; a stream
// the servers do not answer for is left out.
func Leaders(ctx context.Context, js jetstream.JetStream, streams []string) ([]StreamLeader, error) {
	var out []StreamLeader
	var errs []error
	for _, name := range streams {
		st, err := js.Stream(ctx, name)
		if err != nil {
			errs = append(errs, fmt.Errorf("stream %s: %w", name, err))
			continue
		}
		sl := StreamLeader{Stream: name, Replicas: []string{}}
		if ci := st.CachedInfo().Cluster; ci != nil {
			sl.Leader = ci.Leader
			for _, r := range ci.Replicas {
				sl.Replicas = append(sl.Replicas, r.Name)
				if r.Current && !r.Offline {
					sl.Current = append(sl.Current, r.Name)
				}
			}
		}
		out = append(out, sl)
	}
	return out, errors.Join(errs...)
}

// Spread is the most streams any one server should lead: ceil(P/S) for
// P streams over S servers.
func Spread(streams, servers int) int {
	if servers <= 0 {
		return streams
	}
	return (streams + servers - 1) / servers
}

// Move is one stepdown a balance asks for.
type Move struct {
	Stream, From, To string
}

// PlanMoves says which stepdowns bring every server to at most
// Spread(len(ls), servers) leaders, one move per stream: from the
// server that leads most to the current replica that leads fewest.
// Streams without a leader, and servers holding no replica of a stream,
// are left alone.
func PlanMoves(ls []StreamLeader) []Move {
	count := map[string]int{}
	for _, l := range ls {
		if l.Leader != "" {
			count[l.Leader] += 0
		}
		for _, r := range l.Replicas {
			count[r] += 0
		}
	}
	for _, l := range ls {
		if l.Leader != "" {
			count[l.Leader]++
		}
	}
	limit := Spread(len(ls), len(count))
	moved := map[string]bool{}
	var out []Move
	for {
		// The server leading most, by name on a tie.
		var top string
		for s, n := range count {
			if top == "" || n > count[top] || (n == count[top] && s < top) {
				top = s
			}
		}
		if top == "" || count[top] <= limit {
			return out
		}
		best := Move{}
		for _, l := range ls {
			if l.Leader != top || moved[l.Stream] {
				continue
			}
			for _, r := range l.Current {
				if count[r]+1 > limit {
					continue
				}
				if best.To == "" || count[r] < count[best.To] || (count[r] == count[best.To] && r < best.To) {
					best = Move{Stream: l.Stream, From: top, To: r}
				}
			}
		}
		if best.To == "" {
			return out // no current replica can take one: wait for the next look
		}
		moved[best.Stream] = true
		count[top]--
		count[best.To]++
		out = append(out, best)
	}
}

// StepDown asks the leader of stream to hand its leadership to the
// server named to (the stream leader stepdown API with a preferred
// placement).
func StepDown(ctx context.Context, nc *nats.Conn, stream, to string) error {
	body, err := json.Marshal(map[string]any{"placement": map[string]string{"preferred": to}})
	if err != nil {
		return err
	}
	if err := jsAPI(ctx, nc, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, body); err != nil {
		return fmt.Errorf("stepdown of stream %s to %s: %w", stream, to, err)
	}
	return nil
}

// jsAPI sends a JetStream API request that answers success or an
// error, and returns that error.
func jsAPI(ctx context.Context, nc *nats.Conn, subject string, body []byte) error {
	msg, err := nc.RequestWithContext(ctx, subject, body)
	if err != nil {
		return err
	}
	var resp struct {
		Success bool `json:"success"`
		Error   *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return err
	}
	if resp.Error != nil {
		return fmt.Errorf("%s (%d)", resp.Error.Description, resp.Error.Code)
	}
	if !resp.Success {
		return errors.New("refused")
	}
	return nil
}

// Balancer evens out the leaders of the partition streams (see above).
// One node (the leader of the leases) runs Step now and then. A server
// gets leaders only once it has been a current replica of every stream
// it holds for Settle (a server that just returned is still catching
// up, and a leader there would keep the stream's readers waiting), and
// each Step moves at most MaxMoves leaders, so the streams' writes move
// a few at a time.
type Balancer struct {
	NC      *nats.Conn
	JS      jetstream.JetStream
	Streams []string
	Logger  *slog.Logger
	// Settle defaults to 30s, MaxMoves to 2.
	Settle   time.Duration
	MaxMoves int
	Now      func() time.Time

	currentSince map[string]time.Time
}

// Step reads the leaders and asks for the stepdowns that spread them.
// It returns the stepdowns asked for that the servers accepted.
func (b *Balancer) Step(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ls, err := Leaders(ctx, b.JS, b.Streams)
	if err != nil {
		return 0, err
	}
	settled := b.settled(ls)
	for i := range ls {
		ls[i].Current = slices.DeleteFunc(slices.Clone(ls[i].Current), func(s string) bool { return !settled[s] })
	}
	moves := PlanMoves(ls)
	if max := cmp.Or(b.MaxMoves, 2); len(moves) > max {
		moves = moves[:max]
	}
	done := 0
	var errs []error
	for _, m := range moves {
		if err := StepDown(ctx, b.NC, m.Stream, m.To); err != nil {
			errs = append(errs, err)
			continue
		}
		done++
		cmp.Or(b.Logger, slog.Default()).Info("stream leader moved to spread the partitions' writes",
			"stream", m.Stream, "from", m.From, "to", m.To)
	}
	return done, errors.Join(errs...)
}

// settled is the servers that have led or been a current replica of
// every stream they hold for at least Settle, as far as the Steps saw.
func (b *Balancer) settled(ls []StreamLeader) map[string]bool {
	now := time.Now
	if b.Now != nil {
		now = b.Now
	}
	t := now()
	current := map[string]bool{} // false once behind in any stream
	mark := func(s string, ok bool) {
		if was, seen := current[s]; !seen || was {
			current[s] = ok
		}
	}
	for _, l := range ls {
		if l.Leader != "" {
			mark(l.Leader, true)
		}
		for _, r := range l.Replicas {
			mark(r, slices.Contains(l.Current, r))
		}
	}
	if b.currentSince == nil {
		b.currentSince = map[string]time.Time{}
	}
	out := map[string]bool{}
	for s, ok := range current {
		if !ok {
			delete(b.currentSince, s)
			continue
		}
		since, seen := b.currentSince[s]
		if !seen {
			b.currentSince[s], since = t, t
		}
		out[s] = t.Sub(since) >= cmp.Or(b.Settle, 30*time.Second)
	}
	return out
}

// LeaderCounts is how many of ls each server leads (servers holding a
// replica and leading none included), by name.
func LeaderCounts(ls []StreamLeader) map[string]int {
	out := map[string]int{}
	for _, l := range ls {
		for _, r := range l.Replicas {
			out[r] += 0
		}
		if l.Leader != "" {
			out[l.Leader]++
		}
	}
	return out
}
