package cluster

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// serveNode runs the internal API of a node whose own state says
// whether it serves a partition now.
func serveNode(t *testing.T, local Local, v view, serves func(int) bool) string {
	t.Helper()
	r, err := New(Config{Local: local, Membership: v, Credential: testCredential, Serves: serves})
	require.NoError(t, err)
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestReadsSkipANodeThatNoLongerServesThePartition: the leases a node
// reads still list X as a caught-up owner of partition 1, but X has
// since stopped serving it (it handed the partition back, or its
// consumer trails the stream), and X's copy lacks the newest reading.
// A read through another node, and one through X itself, is answered
// by the owner that serves it, never from X's old copy.
func TestReadsSkipANodeThatNoLongerServesThePartition(t *testing.T) {
	ctx := context.Background()
	old := &memLocal{rs: []buckets.Reading{reading("d1", 10, 1)}}
	current := &memLocal{rs: []buckets.Reading{reading("d1", 20, 2), reading("d1", 10, 1)}}
	notServing := func(int) bool { return false }
	xURL := serveNode(t, old, view{}, notServing)
	yURL := serveNode(t, current, view{}, nil)

	a, err := New(Config{Local: &memLocal{}, Credential: testCredential,
		Membership: view{owners: map[int][]Peer{1: {{Node: "x", URL: xURL}, {Node: "y", URL: yURL}}}}})
	require.NoError(t, err)
	x, err := New(Config{Local: old, Credential: testCredential, Serves: notServing,
		Membership: view{owners: map[int][]Peer{1: {{Node: "x", Self: true}, {Node: "y", URL: yURL}}}}})
	require.NoError(t, err)

	for name, r := range map[string]*Router{"through another node": a, "through x": x} {
		rs, err := r.Latest(ctx, "d1", 1)
		require.NoError(t, err, name)
		require.Len(t, rs, 1, name)
		assert.Equal(t, buckets.Ticks(20), rs[0].Ticks, "%s: the newest reading, from the owner that serves the partition", name)
		p, err := r.Range(ctx, buckets.RangeQuery{Device: "d1"})
		require.NoError(t, err, name)
		assert.Len(t, p.Readings, 2, name)
	}

	// No owner serves it: a 503 naming the partition, not X's old copy.
	none, err := New(Config{Local: &memLocal{}, Credential: testCredential,
		Membership: view{owners: map[int][]Peer{1: {{Node: "x", URL: xURL}}}}})
	require.NoError(t, err)
	_, err = none.Latest(ctx, "d1", 1)
	var ue *UnavailableError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, 1, ue.Partition)
}
