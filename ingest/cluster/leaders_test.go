package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// leadersOn is n streams all led by lead, each replicated on servers.
func leadersOn(n int, lead string, servers ...string) []StreamLeader {
	var out []StreamLeader
	for p := range n {
		l := StreamLeader{Stream: fmt.Sprintf("TELEMETRY_%d", p), Leader: lead}
		for _, s := range servers {
			if s != lead {
				l.Replicas = append(l.Replicas, s)
				l.Current = append(l.Current, s)
			}
		}
		out = append(out, l)
	}
	return out
}

// apply is the leaders after moves.
func apply(ls []StreamLeader, moves []Move) map[string]int {
	by := map[string]string{}
	for _, l := range ls {
		by[l.Stream] = l.Leader
	}
	for _, m := range moves {
		by[m.Stream] = m.To
	}
	out := map[string]int{}
	for _, lead := range by {
		out[lead]++
	}
	return out
}

// TestPlanMoves: the moves bring every server to at most ceil(P/S)
// leaders, each to a current replica, one per stream; nothing moves
// when the leaders are spread, or when no current replica can take one.
func TestPlanMoves(t *testing.T) {
	servers := []string{"nats-0", "nats-1", "nats-2"}
	for _, n := range []int{1, 2, 3, 6, 7, 12} {
		ls := leadersOn(n, "nats-0", servers...)
		moves := PlanMoves(ls)
		for _, c := range apply(ls, moves) {
			assert.LessOrEqual(t, c, Spread(n, 3), "%d streams: %v", n, moves)
		}
		seen := map[string]bool{}
		for _, m := range moves {
			assert.False(t, seen[m.Stream], "one move per stream")
			seen[m.Stream] = true
			assert.Equal(t, "nats-0", m.From)
		}
		assert.Empty(t, PlanMoves(func() []StreamLeader {
			for i := range ls {
				for _, m := range moves {
					if m.Stream == ls[i].Stream {
						ls[i].Leader = m.To
					}
				}
			}
			return ls
		}()), "spread leaders stay")
	}
	// The replicas that could take them are behind or offline.
	ls := leadersOn(6, "nats-0", servers...)
	for i := range ls {
		ls[i].Current = nil
	}
	assert.Empty(t, PlanMoves(ls))
	// A stream without a leader is left alone and counts for no one.
	ls = leadersOn(3, "nats-0", servers...)
	ls[0].Leader = ""
	moves := PlanMoves(ls)
	assert.Len(t, moves, 1, "nats-0 leads 2 of 3")
	for _, m := range moves {
		assert.NotEqual(t, "TELEMETRY_0", m.Stream)
	}
	assert.Equal(t, 6, Spread(6, 1))
	assert.Equal(t, 3, Spread(7, 3))
}

// TestParseConsumerName: a partition consumer's name gives back its
// node (dashes included) and partition; other names are not one.
func TestParseConsumerName(t *testing.T) {
	node, p, ok := parseConsumerName(ConsumerName("node-p-1", 11))
	assert.True(t, ok)
	assert.Equal(t, "node-p-1", node)
	assert.Equal(t, 11, p)
	for _, name := range []string{"ingest", "ingest-node", "ingest--p1", "ingest-n-p01", "ingest-n-px", "other-n-p1"} {
		_, _, ok := parseConsumerName(name)
		assert.False(t, ok, name)
	}
}

// TestBalancerSettled: a server gets leaders only once it has been
// current in every stream it holds for Settle; being behind in one
// stream starts its time again.
func TestBalancerSettled(t *testing.T) {
	now := time.Unix(0, 0)
	b := &Balancer{Settle: 30 * time.Second, Now: func() time.Time { return now }}
	ls := leadersOn(2, "nats-0", "nats-0", "nats-1", "nats-2")
	assert.Equal(t, map[string]bool{"nats-0": false, "nats-1": false, "nats-2": false}, b.settled(ls))
	now = now.Add(30 * time.Second)
	assert.Equal(t, map[string]bool{"nats-0": true, "nats-1": true, "nats-2": true}, b.settled(ls))
	ls[1].Current = []string{"nats-1"} // nats-2 behind in one stream
	assert.False(t, b.settled(ls)["nats-2"])
	ls[1].Current = []string{"nats-1", "nats-2"}
	now = now.Add(10 * time.Second)
	assert.False(t, b.settled(ls)["nats-2"], "caught up again 0 s ago")
	now = now.Add(30 * time.Second)
	assert.True(t, b.settled(ls)["nats-2"])
}
