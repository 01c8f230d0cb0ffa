package membudget

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
)

func TestPlanMemory(t *testing.T) {
	b, err := Plan(1<<30, 2, 8, api.DefaultMaxWriteBytes)
	require.NoError(t, err)
	assert.Equal(t, int64(32<<20), b.MemTable/(1<<20)*(1<<20), "1 GiB keeps 32 MiB memtables")
	small, err := Plan(512<<20, 2, 8, api.DefaultMaxWriteBytes)
	require.NoError(t, err)
	assert.Equal(t, b.MemTable/2, small.MemTable, "half the limit, half the memtables")
	assert.Less(t, small.Queries, b.Queries)
	assert.GreaterOrEqual(t, small.Writes, api.MinWriteBudget(api.DefaultMaxWriteBytes), "the largest write body always fits")
	assert.GreaterOrEqual(t, small.PullBytes, int64(MinPullBytes), "two of the largest messages always fit")

	// The parts sized by a knob stay within the limit, and the Go
	// runtime's soft limit is below it.
	for _, limit := range []int64{256 << 20, 512 << 20, 1 << 30, 4 << 30} {
		b, err := Plan(limit, 2, 8, api.DefaultMaxWriteBytes)
		require.NoError(t, err)
		sized := 4*int64(b.HotTables)*b.MemTable + int64(b.HotTables)*b.BlockCache +
			int64(b.OpenTables)*b.IndexCache + b.JetStream + b.Consumer + b.Queries + b.Writes
		assert.Less(t, sized, limit*3/4, "limit %d", limit)
		assert.Less(t, b.GoSoftLimit, limit)
	}
	_, err = Plan(100<<20, 2, 8, api.DefaultMaxWriteBytes)
	assert.ErrorContains(t, err, "below the minimum")
}
