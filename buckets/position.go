package buckets

import "time"

// StreamPosition is how far storage has settled a stream: every message
// up to and including Seq was committed or dead-lettered. A consumer
// created anew starts after it, so it does not replay the stream from
// its beginning.
type StreamPosition struct {
	// Stream is the stream's name.
	Stream string
	// Created is the stream's creation time. A stream deleted and
	// created again starts its sequences over, so a position whose
	// Created differs from the stream's is stale.
	Created time.Time
	// Seq is the stream sequence settled up to.
	Seq uint64
}

// Tombstone records that a day table was dropped (by hand, by the size
// guard or by retention) at a time, so that readings of that day
// published before the drop are never written again by a replay.
type Tombstone struct {
	Day     Day
	Dropped time.Time
}
