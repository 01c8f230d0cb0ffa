package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/telemetryd/telemetryd/buckets"
)

// Attributes set over HTTP are not in the stream: a node that starts
// consuming a partition (to take it over, or back from an outage) and
// replays the stream would lack those set before. Before it answers for
// the partition it therefore copies the partition's attribute state
// from an owner that answers for it (Router.CopyAttributes), through
// pathAttrState: per device the assignments that rebuild its
// attributes with their times, merged by the same newest-wins rule as
// any assignment, so nothing newer the node has is rolled back.

// pathAttrState is the node-to-node call that lists a partition's
// attribute state; only a node's own call (callerNode) may make it.
const pathAttrState = "/internal/v1/attributes/state"

// attrStatePage is how many devices one pathAttrState answer lists.
const attrStatePage = 500

type attrStateRequest struct {
	Partitions []int            `json:"partitions"`
	After      buckets.DeviceID `json:"after"`
	Limit      int              `json:"limit"`
}

type attrStateResponse struct {
	Assignments []wireAssignment `json:"assignments"`
	Next        buckets.DeviceID `json:"next,omitempty"`
	More        bool             `json:"more,omitempty"`
}

// nodeCall marks a context whose node-to-node calls this node makes on
// its own behalf, not a client's.
type nodeCall struct{}

func asNode(ctx context.Context) context.Context { return context.WithValue(ctx, nodeCall{}, true) }

func isNodeCall(ctx context.Context) bool { return ctx.Value(nodeCall{}) != nil }

func (h *Handler) attrState(w http.ResponseWriter, r *http.Request) {
	var q attrStateRequest
	if !decode(w, r, &q) {
		return
	}
	if q.Limit < 1 || q.Limit > attrStatePage {
		writeError(w, http.StatusBadRequest, "invalid_argument", fmt.Sprintf("limit %d: want 1 to %d", q.Limit, attrStatePage))
		return
	}
	if !h.servingAll(w, q.Partitions) {
		return
	}
	as, next, more, err := h.local.AttributeState(r.Context(), q.After, q.Limit,
		func(d buckets.DeviceID) bool { return slices.Contains(q.Partitions, h.part(d)) })
	h.reply(w, r, err, func() any {
		return attrStateResponse{Assignments: toWireAssignments(as), Next: next, More: more}
	})
}

// CopyAttributes copies the attribute state of partition p from an
// owner that answers for it into this node's store (see above). With
// no other owner answering for p there is nothing to copy from, and it
// returns nil; when every such owner fails it returns an
// *UnavailableError naming p, and the caller tries again later.
func (r *Router) CopyAttributes(ctx context.Context, p int) error {
	var errs []error
	for _, o := range r.members.Owners(p) {
		if o.Self {
			continue
		}
		n, err := r.copyAttributesFrom(ctx, o.URL, p)
		if err == nil {
			r.log.InfoContext(ctx, "copied the attributes of a partition from an owner", "partition", p, "node", o.Node, "assignments", n)
			return nil
		}
		if !errors.Is(err, errTransport) || ctx.Err() != nil {
			return fmt.Errorf("copy the attributes of partition %d from %s: %w", p, o.Node, err)
		}
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return unavailable(p, errs)
	}
	return nil
}

// copyAttributesFrom copies p's attribute state from the node at base,
// page by page, and returns how many assignments it applied.
func (r *Router) copyAttributesFrom(ctx context.Context, base string, p int) (int, error) {
	n := 0
	q := attrStateRequest{Partitions: []int{p}, Limit: attrStatePage}
	for {
		var out attrStateResponse
		if err := r.c.call(asNode(ctx), base, pathAttrState, q, &out); err != nil {
			return n, err
		}
		as, err := fromWireAssignments(out.Assignments)
		if err != nil {
			return n, err
		}
		if len(as) > 0 {
			if err := r.local.Assign(ctx, as); err != nil {
				return n, err
			}
		}
		n += len(as)
		if !out.More {
			return n, nil
		}
		q.After = out.Next
	}
}
