package main

import (
	"bytes"
	"context"
	"log/slog"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets/bucketstest"
	"github.com/telemetryd/telemetryd/cmd/internal/cliflag"
	"github.com/telemetryd/telemetryd/cmd/internal/membudget"
)

func TestMemoryLimitFlag(t *testing.T) {
	for in, want := range map[string]int64{
		"512MiB": 512 << 20, "2GiB": 2 << 30, "1GB": 1e9, "1073741824": 1 << 30, "1.5GiB": 3 << 29,
	} {
		c := DefaultConfig()
		require.NoError(t, c.parseFlags("telemetryd", []string{"-memory-limit", in}, envMap(nil), &bytes.Buffer{}), in)
		assert.Equal(t, want, c.MemoryLimit, in)
	}
	c := DefaultConfig()
	require.NoError(t, c.parseFlags("telemetryd", nil, envMap(map[string]string{"TELEMETRY_MEMORY_LIMIT": "768MiB"}), &bytes.Buffer{}))
	assert.Equal(t, int64(768<<20), c.MemoryLimit)
	assert.Equal(t, int64(1<<30), DefaultConfig().MemoryLimit)
	assert.Equal(t, "1GiB", cliflag.FormatBytes(1<<30))
	assert.Equal(t, "512MiB", cliflag.FormatBytes(512<<20))
	assert.Equal(t, "1000", cliflag.FormatBytes(1000))
}

// The service applies the budget: the runtime's soft limit, one INFO
// line with what each part got and, at DEBUG, how each was sized.
func TestServiceLogsAndAppliesTheMemoryBudget(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	defer debug.SetGCPercent(debug.SetGCPercent(membudget.GCPercent + 30)) // not the budget's: Open must set it
	cfg := newTestConfig(t)
	cfg.MemoryLimit = 512 << 20
	cfg.LogLevel = "info"
	var logs bucketstest.SyncBuffer
	m := NewMain(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), func(string) string { return "" })
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	require.NoError(t, m.Open(context.Background()))
	assert.Equal(t, int64(384<<20), debug.SetMemoryLimit(-1))
	// The budget's GOGC, or lower once the pacer has seen a live heap
	// larger than its headroom.
	gogc := debug.SetGCPercent(100)
	assert.LessOrEqual(t, gogc, membudget.GCPercent, "the budget's GOGC at most")
	assert.GreaterOrEqual(t, gogc, membudget.MinGCPercent)
	out := logs.String()
	var info []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "level=INFO") && strings.Contains(l, "memory budget") {
			info = append(info, l)
		}
	}
	require.Len(t, info, 1, "one INFO line: %s", out)
	for _, kv := range []string{`memory_limit="512 MiB"`, "gogc=100", `go_soft_limit="384 MiB"`, `memtables="128 MiB"`, "block_caches=", "index_caches=",
		"jetstream_memory=", "consumer_buffers=", "query_responses=", "write_bodies=", `gc_headroom="77 MiB"`} {
		assert.Contains(t, info[0], kv)
	}
	for _, part := range []string{"hot table memtables", "block caches", "index caches", "embedded jetstream memory", "write bodies",
		"consumer buffers", "query responses", "go runtime soft limit"} {
		assert.Contains(t, out, `level=DEBUG msg="memory budget part" part="`+part+`"`)
	}
	assert.Contains(t, out, "2 hot tables x 2 memtables x 4.0 MiB")
	assert.Equal(t, int64(m.budget.JetStream), m.nats.NATS().JetStreamConfig().MaxMemory)
}

// An operator's GOGC (read by the runtime at start) is kept: the
// service sets its own only when the variable is unset.
func TestServiceKeepsTheOperatorsGOGC(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	debug.SetGCPercent(80) // as GOGC=80 would have set it
	cfg := newTestConfig(t)
	var logs bucketstest.SyncBuffer
	m := NewMain(cfg, slog.New(slog.NewTextHandler(&logs, nil)), envMap(map[string]string{"GOGC": "80"}))
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	require.NoError(t, m.Open(context.Background()))
	assert.Equal(t, 80, debug.SetGCPercent(100))
	assert.Contains(t, logs.String(), "gogc=env")
}
