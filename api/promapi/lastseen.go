package promapi

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/telemetryd/telemetryd/buckets"
)

// LastSeenName is the series every device that sent a reading has,
// labelled like its value series (device and attributes): its value at
// time t is the time of the device's last reading at or before t, in
// Unix seconds. So
//
//	time() - telemetry_device_last_seen_timestamp_seconds > 600
//
// lists the devices silent for more than ten minutes. A device whose
// last reading is older than the retention has no such series any
// more: its readings are gone and so is it.
const LastSeenName = "telemetry_device_last_seen_timestamp_seconds"

// seenGrid is the spacing of the LastSeenName samples when the select
// does not say when the engine evaluates (inside subqueries, and range
// selectors of instant queries). It must stay below the lookback delta.
const seenGrid = time.Minute

// lastSeenIn reports whether d has a LastSeenName sample in [from, to]:
// it sent a reading by to, and its last one had not expired by from.
func (q *queryable) lastSeenIn(d *buckets.DeviceInfo, from, to buckets.Ticks) bool {
	if d.LastSeen == 0 || d.FirstSeen > to {
		return false
	}
	return q.retention <= 0 || d.LastSeen+buckets.Ticks(q.retention/100) >= from
}

// seenTimes are the times (ms) the LastSeenName series has samples at
// for a select over [mint, maxt]: the engine's evaluation times where
// the hints tell them (one for an instant query, every step of a range
// query), otherwise every seenGrid from the start.
func (q *queryable) seenTimes(h *storage.SelectHints, mint, maxt int64) (first, step, last int64) {
	first, step = mint, 0
	if h != nil {
		// The engine selects (t-lookback, t] for an instant selector
		// evaluated at t, (t-range, t] for a range selector: Start is
		// one millisecond past the open end.
		first, step = h.Start+q.lookback-1, h.Step
		if h.Range > 0 {
			first = h.Start + h.Range - 1
		}
		first = max(first, mint)
	}
	if step <= 0 {
		step = min(seenGrid.Milliseconds(), max(q.lookback/2, 1))
		if h != nil && h.Range == 0 && h.End-h.Start == q.lookback-1 {
			first = maxt // one evaluation, at the end
		}
	}
	return first, step, maxt
}

// seenIter yields the LastSeenName samples of one device. A sample at
// or after the device's last reading is that reading's time, from the
// index, without reading the store; for earlier ones the readings
// between the first such sample and the last reading are read once,
// in order (time stamps only matter).
type seenIter struct {
	ctx               context.Context
	q                 *queryable
	dev               buckets.DeviceID
	seen              seenBounds
	first, step, last int64 // sample times, ms
	loadedSamples
	scanFrom, scanTo   buckets.Ticks
	after              *buckets.Ticks
	pending            []buckets.Ticks // read but not yet passed
	scanDone, havePrev bool
	prev               buckets.Ticks // newest reading passed
}

// seconds is the Unix time of k in seconds.
func seconds(k buckets.Ticks) float64 { return float64(k-unixEpoch) / float64(buckets.TicksPerSecond) }

func (it *seenIter) load() {
	it.read, it.i = true, -1
	lastMs, firstMs := msOf(it.seen.last), msOf(it.seen.first)
	gone := int64(-1)
	if it.q.retention > 0 {
		gone = it.q.retention.Milliseconds()
	}
	for t := it.first; t <= it.last && it.err == nil; t += it.step {
		if t < firstMs {
			continue
		}
		at := it.seen.last
		if t < lastMs {
			var ok bool
			if at, ok = it.newestUpTo(t); !ok {
				continue
			}
		}
		if gone >= 0 && t-msOf(at) > gone {
			continue
		}
		it.buf = append(it.buf, sample{t, seconds(at)})
		if err := it.ctx.Err(); err != nil {
			it.err = err
		}
	}
}

// newestUpTo returns the newest reading at or before ms t (t before the
// last reading). Calls come with t ascending.
func (it *seenIter) newestUpTo(t int64) (buckets.Ticks, bool) {
	if it.q.live != nil {
		if k, found, known := it.q.live.newestUpTo(it.dev, t); known {
			return k, found
		}
	}
	end := ticksOf(t + 1)
	if it.scanFrom == 0 && it.scanTo == 0 { // first call: the newest before, then scan on
		page, err := it.q.src.Range(it.ctx, buckets.RangeQuery{Device: it.dev, From: 0, To: end, Order: buckets.Desc, Limit: 1})
		if err != nil {
			it.err = fmt.Errorf("read the last reading of %s: %w", it.dev, err)
			return 0, false
		}
		if len(page.Readings) == 1 {
			it.prev, it.havePrev = page.Readings[0].Ticks, true
		}
		it.scanFrom, it.scanTo = end, it.seen.last
	}
	for {
		for len(it.pending) > 0 && it.pending[0] < end {
			it.prev, it.havePrev, it.pending = it.pending[0], true, it.pending[1:]
		}
		if len(it.pending) > 0 || it.scanDone || it.err != nil {
			return it.prev, it.havePrev
		}
		it.fill()
	}
}

// fill reads the next page of reading times.
func (it *seenIter) fill() {
	page, err := it.q.src.Range(it.ctx, buckets.RangeQuery{Device: it.dev, From: it.scanFrom, To: it.scanTo,
		Order: buckets.Asc, Limit: it.q.pageSize, After: it.after})
	if err != nil {
		it.err = fmt.Errorf("read the readings of %s: %w", it.dev, err)
		return
	}
	for i := range page.Readings {
		it.pending = append(it.pending, page.Readings[i].Ticks)
	}
	if !page.More || len(page.Readings) == 0 {
		it.scanDone = true
		return
	}
	last := page.Readings[len(page.Readings)-1].Ticks
	it.after = &last
}

// seenSeekIter adds Seek (see seekingIter for the type parameter).
type seenSeekIter[T ~int64] struct{ *seenIter }

// Next implements chunkenc.Iterator.
func (it *seenIter) Next() chunkenc.ValueType { return it.next(it.load) }

// Seek implements chunkenc.Iterator.
func (it seenSeekIter[T]) Seek(t T) chunkenc.ValueType { return it.seek(int64(t), it.load) }

var _ chunkenc.Iterator = seenSeekIter[int64]{}
