package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
	"github.com/telemetryd/telemetryd/store/devindex"
	"github.com/telemetryd/telemetryd/store/repair"
	"github.com/telemetryd/telemetryd/store/storemetrics"
)

// A stored block that fails its checksum or does not decode (a flipped
// bit on disk, a block of a version this build does not know) is never
// decoded into values and never fails a query: readers skip it, the
// answer carries a warning naming its day, device and key
// (buckets.Warn), and the first time this process meets it, it is
// logged and counted in telemetry.store.corrupt_blocks. Writes that
// merge into a reading of such a block write the new values without the
// lost ones; the compactor leaves the device's blocks as they are.
// `telemetryd check` (Store.Check) lists every such block.
//
// A block is refused before any of its values is read.

// BadBlock is a stored block that failed its checksum or its decoding.
type BadBlock = repair.BadBlock

// blockError is the error of a stored block that could not be read.
type blockError struct {
	ref blockRef
	err error
}

func (e *blockError) Error() string {
	return fmt.Sprintf("block %s..%s: %v", e.ref.oldest.FormatTime(), e.ref.newest.FormatTime(), e.err)
}

func (e *blockError) Unwrap() error { return e.err }

// badBlockOf returns the error of a block whose bytes are damaged or of
// an unknown version, or nil for any other error (a Badger failure, a
// cancelled context), which readers pass on.
func badBlockOf(err error) *blockError {
	if err == nil {
		return nil // before errors.As, whose target escapes: no allocation per block read
	}
	var be *blockError
	if errors.As(err, &be) && (errors.Is(be.err, block.ErrCorrupt) || errors.Is(be.err, block.ErrVersion)) {
		return be
	}
	return nil
}

// maxRememberedBadBlocks bounds the set of bad blocks already logged
// and counted; past it, they are logged and counted again.
const maxRememberedBadBlocks = 4096

// badBlocks reports the bad blocks readers meet.
type badBlocks struct {
	counter metric.Int64Counter
	log     *slog.Logger

	mu   sync.Mutex
	seen map[string]struct{} // day and key of each block logged and counted
}

// skip reports the bad block of e (of dev in the table of day) and says
// whether the reader should skip it: false when err is no bad block.
func (b *badBlocks) skip(ctx context.Context, day buckets.Day, dev buckets.DeviceID, err error) bool {
	e := badBlockOf(err)
	if e == nil || b == nil {
		return e != nil
	}
	bb := BadBlock{Day: day, Device: dev, Key: appendBlockKey(nil, dev, e.ref),
		Oldest: e.ref.oldest, Newest: e.ref.newest, Err: e.err}
	buckets.Warn(ctx, fmt.Sprintf("skipped a corrupt block: %s: %v", bb, e.err))
	if b.first(bb) {
		b.counter.Add(context.Background(), 1, storemetrics.KindBlock)
		b.log.Error("stored block is corrupt; queries skip it and warn", "day", day.String(),
			"device", string(dev), "key", fmt.Sprintf("%x", bb.Key), "err", e.err)
	}
	return true
}

// first reports whether bb is met for the first time.
func (b *badBlocks) first(bb BadBlock) bool {
	id := bb.Day.String() + "/" + string(bb.Key)
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen[id]; ok {
		return false
	}
	if len(b.seen) >= maxRememberedBadBlocks {
		clear(b.seen)
	}
	b.seen[id] = struct{}{}
	return true
}

// start sets the counter and exports it at zero, so that dashboards and
// alerts see the series before the first corrupt block.
func (b *badBlocks) start(c metric.Int64Counter) {
	b.counter = c
	c.Add(context.Background(), 0, storemetrics.KindBlock)
	c.Add(context.Background(), 0, storemetrics.KindRecord)
}

// damagedRecords reports the device index records that failed their
// checksum or decoding when the index was loaded.
func (b *badBlocks) damagedRecords(recs []devindex.Damaged) {
	for _, r := range recs {
		b.counter.Add(context.Background(), 1, storemetrics.KindRecord)
		b.log.Error("device index record is corrupt; the device is left out of the index until a writable start rebuilds it from the day tables",
			"device", string(r.Device), "err", r.Err)
	}
}
