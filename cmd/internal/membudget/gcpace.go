package membudget

import (
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// GC pacing. With a fixed GOGC the heap grows by GOGC percent of what
// is live before each collection, so the peak heap is about twice the
// live heap at Go's 100. Much of what is live while telemetryd ingests
// is large buffers that cost a collection little to mark (the embedded
// JetStream's message blocks, Badger's memtables and block cache), yet
// each of their bytes lets another byte of garbage pile up. The pacer
// caps that growth: after each collection it sets GOGC so that the heap
// may grow by at most Headroom bytes past what the collection found
// live (and never by more than GCPercent of it), so a small heap
// collects as seldom as before and a large one grows by a bounded
// amount. MinGCPercent keeps a very large live heap from being
// collected more than twice as often as at Go's 100; there the soft
// limit (GoSoftLimit) decides, as without the pacer. With a floor of
// 25 the JSON ingest of the TSBS file (480-600 MiB live) collected
// twice as often as without the pacer, for no lower peak RSS
// (BENCHMARKS.md).
const (
	// shareHeadroom is the pacer's headroom, in percent of
	// -memory-limit.
	shareHeadroom = 15
	// minHeadroom is the smallest headroom Plan gives.
	minHeadroom = 32 << 20
	// MinGCPercent is the lowest GOGC the pacer sets.
	MinGCPercent = 50
	// gcPercentStep rounds the pacer's GOGC down to a multiple of it,
	// so that small changes of the live heap do not reset it.
	gcPercentStep = 5
	// pacePoll is how often the pacer looks for a new collection.
	pacePoll = 50 * time.Millisecond
)

// PacedGCPercent is the GOGC that lets a live heap of live bytes grow
// by at most headroom bytes: headroom as a percent of live, rounded down
// to a multiple of gcPercentStep, within MinGCPercent and ceiling.
func PacedGCPercent(live, headroom int64, ceiling int) int {
	if live <= 0 || headroom*100/live >= int64(ceiling) {
		return ceiling
	}
	p := int(headroom*100/live) / gcPercentStep * gcPercentStep
	return max(p, min(MinGCPercent, ceiling))
}

// Start applies the budget (Apply), logs it (Log) and runs the pacer
// (Pace) on a goroutine of its own. stop ends the pacer and waits for
// it; calling it again does nothing.
func (b Budget) Start(l *slog.Logger) (stop func()) {
	b.Apply()
	b.Log(l)
	done, ended := make(chan struct{}), make(chan struct{})
	go func() { defer close(ended); b.Pace(done) }()
	return sync.OnceFunc(func() { close(done); <-ended })
}

// Pace runs the pacer until stop is closed: after each collection it
// sets GOGC to PacedGCPercent of the live heap, b.Headroom and
// b.GCPercent. It returns at once when b.GCPercent or b.Headroom is 0
// (the GOGC environment variable decides, or pacing is off).
func (b Budget) Pace(stop <-chan struct{}) {
	if b.GCPercent <= 0 || b.Headroom <= 0 {
		return
	}
	samples := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/live:bytes"}}
	var cycles uint64
	set := b.GCPercent
	t := time.NewTicker(pacePoll)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		metrics.Read(samples)
		if samples[0].Value.Kind() != metrics.KindUint64 || samples[1].Value.Kind() != metrics.KindUint64 {
			return // not this runtime's metrics: leave GOGC as Apply set it
		}
		c := samples[0].Value.Uint64()
		if c == cycles {
			continue // no collection since the last look
		}
		cycles = c
		if p := PacedGCPercent(int64(samples[1].Value.Uint64()), b.Headroom, b.GCPercent); p != set {
			debug.SetGCPercent(p)
			set = p
		}
	}
}
