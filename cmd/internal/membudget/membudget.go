// Package membudget divides telemetryd's memory budget (-memory-limit)
// among the parts of the service that a knob sizes: the Go runtime's
// soft limit, the hot tables' memtables and caches, the embedded
// JetStream's memory, the consumer's pull buffers and the bytes of
// query responses and write bodies in flight; and paces the Go
// collector so that garbage between collections stays within a share
// of it (Budget.Pace).
package membudget

import (
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/dustin/go-humanize"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/ingest/natsembed"
	"github.com/telemetryd/telemetryd/store"
)

// DefaultLimit is the default of -memory-limit: the memory limit
// of the shipped Kubernetes manifest.
const DefaultLimit = 1 << 30

// MinLimit is the smallest -memory-limit accepted: below it the
// fixed costs (the runtime, the binary, the device index, the largest
// message the server accepts twice over) leave nothing to divide.
const MinLimit = 256 << 20

// Shares of -memory-limit, in percent. What is left (31%) covers what
// is not sized by a knob: Badger compactions and the device index, cold
// day tables (-max-open-tables of them, about 2.4 MiB each), the
// embedded NATS server's file store caches, the HTTP server, stacks and
// the binary itself, and the garbage the Go runtime lets pile up
// between collections (at most shareHeadroom of the limit once the
// live heap is large; see gcpace.go).
const (
	shareMemtables  = 25 // hot tables' memtables, their write-ahead log pages and flush buffers
	shareBlockCache = 4  // hot tables' Badger block caches
	shareIndexCache = 4  // SSTable indexes and bloom filters of every open table
	shareColumns    = 5  // decoded block columns kept for aggregates asked again (store/colcache)
	shareJetStream  = 5  // embedded JetStream memory-storage limit
	shareConsumer   = 6  // messages pulled but not yet settled
	shareQueries    = 10 // query responses in flight; a fifth as much again for kept range query answers (api.PromQLResultBytes)
	shareWrites     = 8  // line protocol write bodies in flight
	// goSoftLimitShare is the Go runtime's soft limit: memory the
	// runtime does not see (memtable write-ahead logs and SSTables
	// mapped from disk, thread stacks, the binary) takes the rest.
	goSoftLimitShare = 75
)

// memtableCost is what each byte of a hot memtable costs in all: the
// memtable itself, its write-ahead log's pages (mapped from disk), and
// the buffers Badger builds SSTables in (a flush builds the whole
// level-0 table in memory, blocks uncompressed and compressed, in
// buffers that double as they fill; Badger pools them for its next
// flush or compaction, so several grow to a flush's size). Heap
// profiles while the TSBS file was ingested showed about 150 MiB of
// such buffers beside two 16 MiB memtables: about 6.5 times their
// bytes with the memtables and logs. 8 MiB memtables (this cost at
// 1 GiB) took 8% less peak RSS than 16 MiB for the same CPU.
const memtableCost = 8

// GCPercent is the Go runtime's GOGC unless the GOGC environment
// variable sets it: the heap may grow by this share of what is live
// before a collection. It is Go's default: 50 took a third off the
// peak RSS of ingesting the TSBS file but cost 15-25% more CPU per
// reading and 10-20% of the end-to-end rate, enough to fall under the
// same-box ceilings (BENCHMARKS.md, Raw ceilings), while the soft limit
// (GoSoftLimit) already makes collections work harder near the budget.
// GOGC=50 in the environment gives the memory back for that CPU.
const GCPercent = 100

// Floors that keep each part working at the smallest limit.
const (
	minMemTable     = 4 << 20                         // Badger's transactions are a fraction of a memtable
	minBlockCache   = 1 << 20                         // Badger needs a block cache when compression is on
	minIndexCache   = 1 << 20                         //
	minColumnCache  = 4 << 20                         // an hour of a few hundred devices' values
	MinPullBytes    = 2 * natsembed.DefaultMaxPayload // twice the largest message the embedded server accepts
	minQueryBudget  = 8 << 20                         // a few full pages of 10,000 readings
	minJetStreamMem = 16 << 20                        //
)

// Budget is how -memory-limit is divided. Create it with
// Plan.
type Budget struct {
	Limit       int64 // -memory-limit
	GoSoftLimit int64 // debug.SetMemoryLimit
	GCPercent   int   // debug.SetGCPercent; 0 leaves it to GOGC
	Headroom    int64 // the heap's growth past what is live, at most (Pace); 0: GCPercent alone
	HotTables   int   // -hot-days
	OpenTables  int   // hot tables plus -max-open-tables cold ones
	MemTable    int64 // each memtable of a hot table (two per table)
	BlockCache  int64 // block cache of each hot table
	IndexCache  int64 // index cache of each open table
	ColumnCache int64 // the store's decoded column cache
	JetStream   int64 // embedded JetStream max memory
	PullBytes   int64 // bytes of messages pulled at most (a quarter of the consumer share)
	Consumer    int64 // the consumer share: pulled messages plus decoded readings
	Queries     int64 // response bytes in flight
	Writes      int64 // write body bytes in flight (at least api.MinWriteBudget of -max-write-bytes)
}

// Plan divides limit among the parts of the service, for hotDays
// hot tables, maxOpen cold ones and write bodies of maxWrite bytes.
func Plan(limit int64, hotDays, maxOpen int, maxWrite int64) (Budget, error) {
	if limit < MinLimit {
		return Budget{}, fmt.Errorf("-memory-limit %s is below the minimum %s",
			humanize.IBytes(uint64(max(limit, 0))), humanize.IBytes(MinLimit))
	}
	share := func(pct int64) int64 { return limit * pct / 100 }
	b := Budget{
		Limit:       limit,
		GoSoftLimit: share(goSoftLimitShare),
		GCPercent:   GCPercent,
		Headroom:    max(share(shareHeadroom), minHeadroom),
		HotTables:   hotDays,
		OpenTables:  hotDays + maxOpen,
		Consumer:    share(shareConsumer),
	}
	// store.HotMemtables per hot table, each costing memtableCost
	// times its size.
	b.MemTable = max(share(shareMemtables)/int64(memtableCost*store.HotMemtables*hotDays), minMemTable)
	b.BlockCache = max(share(shareBlockCache)/int64(hotDays), minBlockCache)
	b.IndexCache = max(share(shareIndexCache)/int64(b.OpenTables), minIndexCache)
	b.ColumnCache = max(share(shareColumns), minColumnCache)
	b.JetStream = max(share(shareJetStream), minJetStreamMem)
	// Pulled messages wait for the batch loop, which holds a few
	// batches of readings: more than a quarter of the share in pulls
	// only fills the heap. With half of it (31 MiB at 1 GiB) the peak
	// RSS of ingesting the TSBS file as JSON was 12% higher at the
	// same rate (BENCHMARKS.md).
	b.PullBytes = max(b.Consumer/4, MinPullBytes)
	b.Queries = max(share(shareQueries), minQueryBudget)
	b.Writes = max(share(shareWrites), api.MinWriteBudget(maxWrite))
	return b, nil
}

// Apply sets the Go runtime's soft memory limit and, unless
// b.GCPercent is 0, its GOGC.
func (b Budget) Apply() {
	debug.SetMemoryLimit(b.GoSoftLimit)
	if b.GCPercent > 0 {
		debug.SetGCPercent(b.GCPercent)
	}
}

// Log writes the division in one line at INFO (each part's size under
// its own key) and how each part was sized at DEBUG, one line per part.
func (b Budget) Log(l *slog.Logger) {
	ib := func(n int64) string { return humanize.IBytes(uint64(n)) }
	rows := []struct {
		key, part string
		total     int64
		how       string
	}{
		{"go_soft_limit", "go runtime soft limit", b.GoSoftLimit, fmt.Sprintf("debug.SetMemoryLimit, with GOGC %s; the rest is memory the runtime does not see", gogc(b.GCPercent))},
		{"gc_headroom", "heap growth between collections", b.Headroom, fmt.Sprintf("GOGC lowered (to %d at least) once the live heap is larger than 100/GOGC times this", MinGCPercent)},
		{"memtables", "hot table memtables", int64(memtableCost*store.HotMemtables*b.HotTables) * b.MemTable,
			fmt.Sprintf("%d hot tables x %d memtables x %s, plus their write-ahead log pages and flush buffers (%d times the memtables in all)",
				b.HotTables, store.HotMemtables, ib(b.MemTable), memtableCost)},
		{"block_caches", "block caches", int64(b.HotTables) * b.BlockCache, fmt.Sprintf("%d hot tables x %s", b.HotTables, ib(b.BlockCache))},
		{"index_caches", "index caches", int64(b.OpenTables) * b.IndexCache, fmt.Sprintf("up to %d open tables x %s", b.OpenTables, ib(b.IndexCache))},
		{"column_cache", "column cache", b.ColumnCache, "decoded block columns of aggregates, for questions asked again"},
		{"jetstream_memory", "embedded jetstream memory", b.JetStream, "max memory of memory-storage streams"},
		{"consumer_buffers", "consumer buffers", b.Consumer, fmt.Sprintf("pulls of at most %s plus decoded readings", ib(b.PullBytes))},
		{"query_responses", "query responses", b.Queries, fmt.Sprintf("response bytes in flight, at most a %d-th per client; past it 503 (429 past a client's share) with Retry-After", api.DefaultClientShares)},
		{"query_results", "kept range query answers", api.PromQLResultBytes(b.Queries), "answers by step, so a dashboard's next refresh evaluates only its new steps"},
		{"write_bodies", "write bodies", b.Writes, "line protocol bodies in flight, received, gunzipped and being mapped; past it 503 with Retry-After"},
	}
	args := []any{"memory_limit", ib(b.Limit), "gogc", gogc(b.GCPercent)}
	for _, r := range rows {
		args = append(args, r.key, ib(r.total))
	}
	l.Info("memory budget", args...)
	for _, r := range rows {
		l.Debug("memory budget part", "part", r.part, "bytes", ib(r.total), "detail", r.how)
	}
}

// gogc names the GOGC that percent leaves the runtime with: the
// percent, or "env" when the GOGC environment variable decides.
func gogc(percent int) string {
	if percent <= 0 {
		return "env"
	}
	return fmt.Sprint(percent)
}
