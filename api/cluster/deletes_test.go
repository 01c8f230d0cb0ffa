package cluster

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// A device delete reaches every live node, adds up the readings the
// nodes removed, and is not found when no node knew the device.
func TestRouterDeleteDeviceOnEveryNode(t *testing.T) {
	other := &memLocal{rs: []buckets.Reading{reading("d1", 1, 1), reading("d1", 2, 1), reading("d3", 1, 1)}}
	v := view{}
	v.nodes = []Peer{{Node: "a", Self: true}, {Node: "b", URL: serve(t, other, v)}}
	self := &memLocal{rs: []buckets.Reading{reading("d1", 1, 1), reading("d2", 1, 1)}}
	r, err := New(Config{Local: self, Membership: v, Credential: testCredential})
	require.NoError(t, err)

	d, err := r.DeleteDevice(context.Background(), "d1")
	require.NoError(t, err)
	assert.Equal(t, int64(3), d.Readings, "both nodes' copies")
	assert.Empty(t, self.of("d1"))
	assert.Empty(t, other.of("d1"))
	assert.Len(t, self.of("d2"), 1, "other devices stay")
	assert.Len(t, other.of("d3"), 1, "other devices stay")

	_, err = r.DeleteDevice(context.Background(), "d1")
	assert.ErrorIs(t, err, buckets.ErrNotFound, "no node knows it any more")
}
