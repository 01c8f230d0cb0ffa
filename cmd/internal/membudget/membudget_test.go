package membudget

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

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
			int64(b.OpenTables)*b.IndexCache + b.JetStream + b.Consumer + b.Queries + api.PromQLResultBytes(b.Queries) + b.Writes
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

// The pacer's GOGC: the budget's GOGC while headroom is at least that
// share of the live heap, headroom's share past it, never below
// MinGCPercent.
func TestPacedGCPercentAtItsBoundaries(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name           string
		live, headroom int64
		want           int
	}{
		{"nothing live yet", 0, 100 * mib, 100},
		{"headroom is exactly the live heap", 100 * mib, 100 * mib, 100},
		{"one byte more live", 100*mib + 1, 100 * mib, 95},
		{"live a quarter above the headroom", 125 * mib, 100 * mib, 80},
		{"rounded down to a step", 150 * mib, 100 * mib, 65},
		{"live exactly at the floor", 200 * mib, 100 * mib, MinGCPercent},
		{"live past the floor", 4000 * mib, 100 * mib, MinGCPercent},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, PacedGCPercent(c.live, c.headroom, 100))
		})
	}
	assert.Equal(t, 20, PacedGCPercent(4000*mib, 100*mib, 20), "a budget's GOGC below the floor stays the ceiling")
}

// Pace lowers GOGC once the live heap outgrows the headroom, and puts
// it back once the heap is small again.
func TestPaceFollowsTheLiveHeap(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	b, err := Plan(1<<30, 2, 8, api.DefaultMaxWriteBytes)
	require.NoError(t, err)
	assert.Equal(t, int64(1<<30)*shareHeadroom/100, b.Headroom)
	b.Headroom = 8 << 20
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); b.Pace(stop) }()
	defer func() { close(stop); <-done }()

	gogc := func() int {
		s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
		metrics.Read(s)
		return int(s[0].Value.Uint64())
	}
	big := make([][]byte, 64) // 64 MiB live: eight times the headroom
	for i := range big {
		big[i] = make([]byte, 1<<20)
	}
	require.Eventually(t, func() bool { runtime.GC(); return gogc() == MinGCPercent }, 10*time.Second, 20*time.Millisecond,
		"64 MiB live against 8 MiB of headroom: GOGC %d", gogc())
	runtime.KeepAlive(big)
	big = nil
	require.Eventually(t, func() bool { runtime.GC(); return gogc() == GCPercent }, 10*time.Second, 20*time.Millisecond,
		"the heap small again: GOGC %d", gogc())
}
