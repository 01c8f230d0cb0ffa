package membudget

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/store"
)

func TestPlanMemory(t *testing.T) {
	b, err := Plan(1<<30, 2, 8, api.DefaultMaxWriteBytes)
	require.NoError(t, err)
	// A quarter of the limit for 2 hot tables x 2 memtables, each
	// costing memtableCost (8) times its size with its log and Badger's
	// table-building buffers.
	assert.Equal(t, int64(8<<20), b.MemTable/(1<<20)*(1<<20), "1 GiB keeps 8 MiB memtables")
	assert.Equal(t, GCPercent, b.GCPercent)
	small, err := Plan(512<<20, 2, 8, api.DefaultMaxWriteBytes)
	require.NoError(t, err)
	assert.Equal(t, b.MemTable/2, small.MemTable, "half the limit, half the memtables")
	assert.Less(t, small.Queries, b.Queries)
	assert.GreaterOrEqual(t, small.Writes, api.MinWriteBudget(api.DefaultMaxWriteBytes), "the largest write body always fits")
	assert.GreaterOrEqual(t, small.PullBytes, int64(MinPullBytes), "two of the largest messages always fit")
	assert.Equal(t, int64(MinPullBytes), b.PullBytes, "1 GiB pulls two of the largest messages' bytes, no more")
	big, err := Plan(4<<30, 2, 8, api.DefaultMaxWriteBytes)
	require.NoError(t, err)
	assert.Equal(t, big.Consumer/4, big.PullBytes, "a quarter of the consumer share")

	// The parts sized by a knob stay within the limit, and the Go
	// runtime's soft limit is below it. At the minimum limit the floors
	// decide (4 MiB memtables, whose table-building buffers are smaller
	// than memtableCost says: Badger's first buffer is 4 MiB).
	tiny, err := Plan(MinLimit, 2, 8, api.DefaultMaxWriteBytes)
	require.NoError(t, err)
	assert.Equal(t, int64(minMemTable), tiny.MemTable)
	assert.Less(t, tiny.GoSoftLimit, int64(MinLimit))
	for _, limit := range []int64{512 << 20, 1 << 30, 4 << 30} {
		b, err := Plan(limit, 2, 8, api.DefaultMaxWriteBytes)
		require.NoError(t, err)
		sized := memtableCost*store.HotMemtables*int64(b.HotTables)*b.MemTable + int64(b.HotTables)*b.BlockCache +
			int64(b.OpenTables)*b.IndexCache + b.JetStream + b.Consumer + b.Queries + b.Writes
		assert.Less(t, sized, limit*3/4, "limit %d", limit)
		assert.Less(t, b.GoSoftLimit, limit)
	}
	_, err = Plan(100<<20, 2, 8, api.DefaultMaxWriteBytes)
	assert.ErrorContains(t, err, "below the minimum")
}

// Apply sets GOGC to the budget's GCPercent, and leaves it alone when
// GCPercent is 0 (the GOGC environment variable decides).
func TestApplySetsGOGC(t *testing.T) {
	prev := debug.SetGCPercent(GCPercent + 30) // not the budget's: Apply must set it
	defer debug.SetGCPercent(prev)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	b, err := Plan(1<<30, 2, 8, api.DefaultMaxWriteBytes)
	require.NoError(t, err)
	b.Apply()
	assert.Equal(t, GCPercent, debug.SetGCPercent(100))
	assert.Equal(t, b.GoSoftLimit, debug.SetMemoryLimit(-1))

	debug.SetGCPercent(120)
	b.GCPercent = 0
	b.Apply()
	assert.Equal(t, 120, debug.SetGCPercent(100), "GCPercent 0 keeps the runtime's GOGC")
}
