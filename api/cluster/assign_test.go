package cluster

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// TestRouterAssignReachesOwnersNotCaughtUp: a PUT through node A while
// owner X of the device's partition trails its stream (X holds the
// partition but is not among the caught-up owners A sees) reaches X
// all the same, so a PATCH through X once it caught up again answers
// the PUT's attributes with its own, and X's copy keeps them.
func TestRouterAssignReachesOwnersNotCaughtUp(t *testing.T) {
	ctx := context.Background()
	x, y := &memLocal{}, &memLocal{}
	v := view{}
	xURL, yURL := serve(t, x, v), serve(t, y, v)

	// Node A (no owner of partition 1): X trails, so only Y is caught up.
	viewA := view{owners: map[int][]Peer{1: {{Node: "y", URL: yURL}}},
		holders: map[int][]Peer{1: {{Node: "x", URL: xURL}, {Node: "y", URL: yURL}}}}
	a, err := New(Config{Local: &memLocal{}, Membership: viewA, Credential: testCredential})
	require.NoError(t, err)
	// Node X itself, caught up again: it answers first for partition 1.
	viewX := view{owners: map[int][]Peer{1: {{Node: "x", Self: true}, {Node: "y", URL: yURL}}}}
	b, err := New(Config{Local: x, Membership: viewX, Credential: testCredential})
	require.NoError(t, err)

	require.NoError(t, a.Assign(ctx, []buckets.Assignment{{Device: "t1", At: 10, Replace: true,
		Set: buckets.Attributes{{Name: "fleet", Value: "East"}, {Name: "tmp", Value: "x"}}}}), "the PUT through A")
	require.NoError(t, b.Assign(ctx, []buckets.Assignment{{Device: "t1", At: 20,
		Set: buckets.Attributes{{Name: "model", Value: "F-150"}}, Remove: []string{"tmp"}}}), "the PATCH through X")
	d, err := b.Device(ctx, "t1")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"fleet": "East", "model": "F-150"}, d.Attributes.Map(), "the PATCH's answer")
	for name, copy := range map[string]*memLocal{"x": x, "y": y} {
		d, err := copy.Device(ctx, "t1")
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"fleet": "East", "model": "F-150"}, d.Attributes.Map(), "the copy of %s", name)
	}
}

// TestRouterAssignUnavailableWhenAHolderIsUnreachable: a node holding
// the partition that cannot be reached fails the write with a
// retryable error naming it, even while it is not caught up; a refusal
// keeps its code; with no node holding the partition the write is
// unavailable.
func TestRouterAssignUnavailableWhenAHolderIsUnreachable(t *testing.T) {
	ctx := context.Background()
	y := &memLocal{}
	yURL := serve(t, y, view{})
	v := view{owners: map[int][]Peer{1: {{Node: "y", URL: yURL}}},
		holders: map[int][]Peer{1: {{Node: "x", URL: "http://127.0.0.1:1"}, {Node: "y", URL: yURL}}}}
	r, err := New(Config{Local: &memLocal{}, Membership: v, Credential: testCredential})
	require.NoError(t, err)
	set := buckets.Attributes{{Name: "fleet", Value: "East"}}

	err = r.Assign(ctx, []buckets.Assignment{{Device: "t1", At: 10, Set: set}})
	require.ErrorIs(t, err, buckets.ErrUnavailable)
	assert.Contains(t, err.Error(), "node x")
	assert.Len(t, y.assigned, 1, "the reachable node applied it; a retry applies it again, harmlessly")

	err = r.Assign(ctx, []buckets.Assignment{{Device: "t1", At: 11, Set: buckets.Attributes{{Name: "bad", Value: "x"}}}})
	var ve *buckets.ValidationError
	require.ErrorAs(t, err, &ve, "the refusal of the first node that answers")
	assert.Equal(t, buckets.CodeInvalidAttributeValue, ve.Code)

	_, err = r.Device(ctx, "t0")
	require.ErrorIs(t, err, buckets.ErrUnavailable)
	err = r.Assign(ctx, []buckets.Assignment{{Device: "t0", At: 12, Set: set}})
	require.ErrorIs(t, err, buckets.ErrUnavailable, "partition 0: no node holds it")
	var ue *UnavailableError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, 0, ue.Partition)
}
