package cluster

import (
	"context"
	"fmt"
	"net/http"

	"github.com/telemetryd/telemetryd/buckets"
)

// A caught-up owner whose consumer trails its partition's stream (it
// has not settled, for longer than its bound, what the stream held at
// some moment: ingest/cluster Config.MaxReadLag) is asked after the
// owners that do not trail, and withdraws from the partition once one
// of them answers; while none does (a NATS server's loss holds every
// owner's consumer up at once) it goes on answering with what it has.
// Such an answer may miss readings the stream acked. So every answer
// that read a partition from a trailing copy, on this node or on
// another, carries the warning PartialWarning(p): in the API's
// Telemetry-Warning header (and so in the "warnings" member of reading
// lists and aggregates, and the warnings of PromQL answers, like any
// warning of the store). An answer without it read only copies that
// did not trail. A streamed export sends its headers before it reads,
// so it carries no such warning.

// HeaderWarning is the API's warning header (one line per warning):
// the node-to-node API sends the partial warnings of its answer in it,
// and the asking node adds every warning an owner sent to its own
// answer.
const HeaderWarning = "Telemetry-Warning"

// PartialWarning is the warning of an answer that read partition p
// from a copy trailing its stream.
func PartialWarning(p int) string {
	return fmt.Sprintf("partial: partition %d was read from a copy trailing its stream; its most recent readings may be missing", p)
}

// trailingHere reports whether this node's copy of partition p trails
// its stream (Config.Trailing).
func (r *Router) trailingHere(p int) bool { return r.trailing != nil && r.trailing(p) }

// warnTrailing adds PartialWarning to ctx's answer for each partition
// of ps whose copy here trails its stream.
func (r *Router) warnTrailing(ctx context.Context, ps ...int) {
	for _, p := range ps {
		if r.trailingHere(p) {
			buckets.Warn(ctx, PartialWarning(p))
		}
	}
}

// headerTrailing adds PartialWarning to the node-to-node answer w for
// each partition of ps whose copy here trails its stream.
func (h *Handler) headerTrailing(w http.ResponseWriter, ps []int) {
	if h.trailing == nil {
		return
	}
	for _, p := range ps {
		if h.trailing(p) {
			w.Header().Add(HeaderWarning, PartialWarning(p))
		}
	}
}

// forwardWarnings adds the warnings of an owner's answer to ctx's.
func forwardWarnings(ctx context.Context, resp *http.Response) {
	for _, m := range resp.Header.Values(HeaderWarning) {
		buckets.Warn(ctx, m)
	}
}
