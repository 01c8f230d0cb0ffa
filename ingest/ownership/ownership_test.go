package ownership

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestRankMovesLittle: ranking is the same whatever the order of the
// nodes; when a node joins, a partition's top owners change only where
// the new node ranks among them, and the load spreads over the nodes.
func TestRankMovesLittle(t *testing.T) {
	const partitions, copies = 120, 2
	three := []string{"node-0", "node-1", "node-2"}
	four := append(slices.Clone(three), "node-3")
	load := map[string]int{}
	for p := range partitions {
		a := Rank(three, p)
		assert.Equal(t, a, Rank([]string{"node-2", "node-0", "node-1"}, p), "order of the input does not matter")
		b := Rank(four, p)
		before, after := a[:copies], b[:copies]
		if !slices.Contains(after, "node-3") {
			assert.Equal(t, before, after, "partition %d moved without the new node", p)
		} else {
			kept := 0
			for _, n := range after {
				if slices.Contains(before, n) {
					kept++
				}
			}
			assert.Equal(t, copies-1, kept, "partition %d: only one owner is replaced", p)
		}
		for _, n := range after {
			load[n]++
		}
	}
	for _, n := range four {
		// 120 x 2 / 4 = 60 each; rendezvous hashing stays near it.
		assert.InDelta(t, 60, load[n], 20, "%s owns %d partitions", n, load[n])
	}
}

func TestValidateNodeName(t *testing.T) {
	assert.NoError(t, ValidateNodeName("node-0"))
	assert.NoError(t, ValidateNodeName("telemetryd-12"))
	for _, bad := range []string{"", "-x", "a.b", "a b", "a*", string(make([]byte, 65))} {
		assert.Error(t, ValidateNodeName(bad), "%q", bad)
	}
}
