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

// trailingWarnings is PartialWarning of each partition of ps whose copy
// here trails its stream, by trailing (nil: none does).
func trailingWarnings(trailing func(int) bool, ps []int) []string {
	var out []string
	for _, p := range ps {
		if trailing != nil && trailing(p) {
			out = append(out, PartialWarning(p))
		}
	}
	return out
}

// warnTrailing adds PartialWarning to ctx's answer for each partition
// of ps whose copy here trails its stream.
func (r *Router) warnTrailing(ctx context.Context, ps ...int) {
	for _, m := range trailingWarnings(r.trailing, ps) {
		buckets.Warn(ctx, m)
	}
}

// headerTrailing adds PartialWarning to the node-to-node answer w for
// each partition of ps whose copy here trails its stream.
func (h *Handler) headerTrailing(w http.ResponseWriter, ps []int) {
	for _, m := range trailingWarnings(h.trailing, ps) {
		w.Header().Add(HeaderWarning, m)
	}
}

// forwardWarnings adds the warnings of an owner's answer to ctx's.
func forwardWarnings(ctx context.Context, resp *http.Response) {
	for _, m := range resp.Header.Values(HeaderWarning) {
		buckets.Warn(ctx, m)
	}
}
