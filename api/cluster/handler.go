package cluster

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
)

// Paths of the node-to-node API (under api.Config.Internal).
const (
	pathLatest    = "/internal/v1/latest"
	pathRange     = "/internal/v1/range"
	pathGet       = "/internal/v1/get"
	pathDevices   = "/internal/v1/devices"
	pathAggregate = "/internal/v1/aggregate"
	pathTables    = "/internal/v1/tables"
	pathDrop      = "/internal/v1/drop"
	pathDevice    = "/internal/v1/device"
	pathAttrs     = "/internal/v1/attributes"
	pathAssign    = "/internal/v1/assign"
)

// maxRequestBytes bounds an internal request body.
const maxRequestBytes = 64 << 10

// Handler serves the node-to-node API from this node's own store:
// every call is answered locally, never forwarded again.
//
// A call must carry the cluster credential (Authorization: Bearer) and
// name the client it serves (HeaderCaller). The credential proves the
// call comes from a node; the caller's token then gets exactly the
// rights the public endpoints give it: scope read for readings, device
// lists, attributes and tables, scope write for attribute assignments,
// scope admin for a drop, and only the devices of its patterns (another
// device is not found, and no list, attribute name or value tells of
// it).
//
// It reads only the partitions this node serves now (Config.Serves of
// its Router): a read of a device of another partition, or a list
// asked for partitions among which some are not served, is refused
// with 503, code not_serving and the partitions refused, after the
// checks of the caller's rights. The calling node's view of the leases
// may be older than this node's state; it asks the next owner.
type Handler struct {
	local      Local
	part       func(buckets.DeviceID) int
	serves     func(partition int) bool // nil: every partition
	trailing   func(partition int) bool // the copies here that trail their streams; nil: none
	credential [sha256.Size]byte
	callers    Callers
	log        *slog.Logger
	mux        *http.ServeMux
}

// Callers looks up an API token by name; nil when this node has no
// authentication (every caller may do everything, as on its public API).
type Callers func(name string) (*auth.Principal, bool)

// NewHandler serves local; part maps a device to its partition;
// credential is the cluster credential calls must carry.
func NewHandler(local Local, part func(buckets.DeviceID) int, credential string, callers Callers, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.Default()
	}
	h := &Handler{local: local, part: part, credential: sha256.Sum256([]byte(credential)), callers: callers,
		log: log, mux: http.NewServeMux()}
	h.mux.HandleFunc("POST "+pathLatest, h.latest)
	h.mux.HandleFunc("POST "+pathRange, h.rangeQ)
	h.mux.HandleFunc("POST "+pathGet, h.get)
	h.mux.HandleFunc("POST "+pathDevices, h.devices)
	h.mux.HandleFunc("POST "+pathAggregate, h.aggregate)
	h.mux.HandleFunc("GET "+pathTables, h.tables)
	h.mux.HandleFunc("POST "+pathDrop, h.drop)
	h.mux.HandleFunc("POST "+pathDeleteDevice, h.deleteDevice)
	h.mux.HandleFunc("POST "+pathDevice, h.device)
	h.mux.HandleFunc("POST "+pathAttrs, h.attributes)
	h.mux.HandleFunc("POST "+pathAssign, h.assign)
	h.mux.HandleFunc("POST "+pathAttrState, h.attrState)
	return h
}

// serving reports whether this node serves dev's partition now; if not
// it answers 503 not_serving naming the partition.
func (h *Handler) serving(w http.ResponseWriter, dev buckets.DeviceID) bool {
	return h.servingAll(w, []int{h.part(dev)})
}

// servingAll reports whether this node serves every partition of ps
// now; if not it answers 503 not_serving naming those it does not. The
// answer of a call it lets through warns of each of ps whose copy here
// trails its stream (PartialWarning).
func (h *Handler) servingAll(w http.ResponseWriter, ps []int) bool {
	if h.serves == nil {
		h.headerTrailing(w, ps)
		return true
	}
	var refused []int
	for _, p := range ps {
		if !h.serves(p) && !slices.Contains(refused, p) {
			refused = append(refused, p)
		}
	}
	if len(refused) == 0 {
		h.headerTrailing(w, ps)
		return true
	}
	slices.Sort(refused)
	what := fmt.Sprintf("partitions %v", refused)
	if len(refused) == 1 {
		what = fmt.Sprintf("partition %d", refused[0])
	}
	writeJSONError(w, http.StatusServiceUnavailable, errorResponse{Code: codeNotServing, Partitions: refused,
		Message: what + ": not served by this node now (handed over, or trailing its stream); ask another owner"})
	return false
}

// Authorize reports whether r carries the cluster credential and, if
// so, returns the principal of the client the call serves (nil when
// neither node has authentication). err says why a call with the
// credential is refused all the same: no caller, or a token this node
// does not know.
func (h *Handler) Authorize(r *http.Request) (caller *auth.Principal, credential bool, err error) {
	scheme, secret, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil, false, nil
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(secret)))
	if subtle.ConstantTimeCompare(got[:], h.credential[:]) != 1 {
		return nil, false, nil
	}
	name, open, err := parseCaller(r.Header.Get(HeaderCaller))
	switch {
	case name == "" && !open && err == nil: // callerNode: this cluster's own call
		if r.URL.Path != pathAttrState {
			return nil, true, fmt.Errorf("a node's own call may only ask %s", pathAttrState)
		}
		return nil, true, nil
	case err != nil:
		return nil, true, err
	case h.callers == nil:
		return nil, true, nil
	case open:
		return nil, true, errors.New("the calling node has no authentication, this one has: give every node the same -auth-file")
	}
	p, ok := h.callers(name)
	if !ok {
		return nil, true, fmt.Errorf("token %q is not in this node's auth file", name)
	}
	return p, true, nil
}

// ServeHTTP implements http.Handler. It checks the call itself (see
// Authorize), whatever ran before it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	caller, ok, err := h.Authorize(r)
	switch {
	case !ok:
		writeError(w, http.StatusUnauthorized, "unauthenticated", "authorization: the node-to-node API needs the cluster credential")
		return
	case err != nil:
		writeError(w, http.StatusForbidden, "permission_denied", "authorization: "+err.Error())
		return
	}
	h.mux.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), caller)))
}

// allowed reports whether the caller has scope and, when dev is set,
// sees dev; otherwise it answers as the public API would (403 for the
// scope, 404 for a device outside the token's patterns).
func allowed(w http.ResponseWriter, r *http.Request, scope auth.Scope, dev buckets.DeviceID) bool {
	p := auth.FromContext(r.Context())
	if !p.Has(scope) {
		writeError(w, http.StatusForbidden, "permission_denied",
			"authorization: token "+p.Name+" lacks the scope "+string(scope)+" this endpoint needs")
		return false
	}
	if dev != "" && !p.DeviceVisible(string(dev)) {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("device: %q is not known", dev))
		return false
	}
	return true
}

func (h *Handler) latest(w http.ResponseWriter, r *http.Request) {
	var q latestRequest
	if !decode(w, r, &q) || !allowed(w, r, auth.ScopeRead, q.Device) {
		return
	}
	if !h.serving(w, q.Device) {
		return
	}
	rs, err := h.local.Latest(r.Context(), q.Device, q.N)
	h.reply(w, r, err, func() any { return readingsResponse{Readings: toWire(rs)} })
}

func (h *Handler) rangeQ(w http.ResponseWriter, r *http.Request) {
	var q buckets.RangeQuery
	if !decode(w, r, &q) || !allowed(w, r, auth.ScopeRead, q.Device) {
		return
	}
	if !h.serving(w, q.Device) {
		return
	}
	p, err := h.local.Range(r.Context(), q)
	h.reply(w, r, err, func() any { return readingsResponse{Readings: toWire(p.Readings), More: p.More} })
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	var q getRequest
	if !decode(w, r, &q) || !allowed(w, r, auth.ScopeRead, q.Device) {
		return
	}
	if !h.serving(w, q.Device) {
		return
	}
	rd, err := h.local.Get(r.Context(), q.Device, q.Ticks)
	h.reply(w, r, err, func() any { return readingsResponse{Readings: toWire([]buckets.Reading{rd})} })
}

func (h *Handler) aggregate(w http.ResponseWriter, r *http.Request) {
	var q buckets.AggregateQuery
	if !decode(w, r, &q) || !allowed(w, r, auth.ScopeRead, q.Device) {
		return
	}
	if !h.serving(w, q.Device) {
		return
	}
	p, err := h.local.Aggregate(r.Context(), q)
	h.reply(w, r, err, func() any { return p })
}

func (h *Handler) devices(w http.ResponseWriter, r *http.Request) {
	var q devicesRequest
	if !decode(w, r, &q) || !allowed(w, r, auth.ScopeRead, "") {
		return
	}
	if !h.servingAll(w, q.Partitions) {
		return
	}
	devs, more, err := localDevices(r.Context(), h.local, h.part, q)
	h.reply(w, r, err, func() any {
		out := devicesResponse{Devices: make([]wireDevice, len(devs)), More: more}
		for i := range devs {
			out.Devices[i] = toWireDevice(&devs[i])
		}
		return out
	})
}

func (h *Handler) device(w http.ResponseWriter, r *http.Request) {
	var q deviceRequest
	if !decode(w, r, &q) || !allowed(w, r, auth.ScopeRead, q.Device) {
		return
	}
	if !h.serving(w, q.Device) {
		return
	}
	d, err := h.local.Device(r.Context(), q.Device)
	h.reply(w, r, err, func() any { return toWireDevice(&d) })
}

func (h *Handler) attributes(w http.ResponseWriter, r *http.Request) {
	var q attributesRequest
	if !decode(w, r, &q) || !allowed(w, r, auth.ScopeRead, "") {
		return
	}
	if !h.servingAll(w, q.Partitions) {
		return
	}
	vals, err := localAttributes(r.Context(), h.local, h.part, q)
	h.reply(w, r, err, func() any { return attributesResponse{Values: vals} })
}

func (h *Handler) assign(w http.ResponseWriter, r *http.Request) {
	var q assignRequest
	if !decode(w, r, &q) || !allowed(w, r, auth.ScopeWrite, "") {
		return
	}
	for _, a := range q.Assignments {
		if !allowed(w, r, auth.ScopeWrite, a.Device) {
			return
		}
	}
	as, err := fromWireAssignments(q.Assignments)
	if err == nil {
		err = h.local.Assign(r.Context(), as)
	}
	h.reply(w, r, err, func() any { return struct{}{} })
}

func (h *Handler) tables(w http.ResponseWriter, r *http.Request) {
	if !allowed(w, r, auth.ScopeRead, "") {
		return
	}
	ts, err := h.local.Tables(r.Context())
	h.reply(w, r, err, func() any { return tablesResponse{Tables: ts} })
}

func (h *Handler) drop(w http.ResponseWriter, r *http.Request) {
	var q dropRequest
	if !decode(w, r, &q) || !allowed(w, r, auth.ScopeAdmin, "") {
		return
	}
	d, err := h.local.DropTable(r.Context(), q.Day)
	h.reply(w, r, err, func() any { return d })
}

// localDevices lists the devices of q.Partitions in the local index
// that q selects and the caller of ctx may see: the store applies the
// partitions and the caller's device patterns with the rest of the
// query.
func localDevices(ctx context.Context, local Local, part func(buckets.DeviceID) int, q devicesRequest) ([]buckets.DeviceInfo, bool, error) {
	if q.Limit < 1 {
		return nil, false, fmt.Errorf("limit %d: %w", q.Limit, buckets.ErrInvalidArgument)
	}
	ms, err := matchersFromWire(q.Match)
	if err != nil {
		return nil, false, err
	}
	return local.Devices(ctx, buckets.DeviceQuery{Prefix: q.Prefix, After: q.After, Limit: q.Limit, Match: ms,
		SilentBefore: q.SilentBefore, Visible: partitionFilter(ctx, part, q.Partitions)})
}

// localAttributes answers an attributesRequest from the local index,
// as localDevices does.
func localAttributes(ctx context.Context, local Local, part func(buckets.DeviceID) int, q attributesRequest) ([]string, error) {
	ms, err := matchersFromWire(q.Match)
	if err != nil {
		return nil, err
	}
	dq := buckets.DeviceQuery{Prefix: q.Prefix, Match: ms, Visible: partitionFilter(ctx, part, q.Partitions)}
	if q.Name == "" {
		return local.AttributeNames(ctx, dq)
	}
	return local.AttributeValues(ctx, q.Name, dq)
}

// partitionFilter keeps the devices of parts that the caller of ctx
// may see. The local store may hold devices of partitions this node
// does not answer for (it owned them once), so every listing is cut to
// the partitions it was asked about.
func partitionFilter(ctx context.Context, part func(buckets.DeviceID) int, parts []int) func(buckets.DeviceID) bool {
	p := auth.FromContext(ctx)
	return func(d buckets.DeviceID) bool {
		return slices.Contains(parts, part(d)) && p.DeviceVisible(string(d))
	}
}

// decode reads a bounded JSON body into v; false when it answered 400.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", "body: "+err.Error())
		return false
	}
	return true
}

// reply writes the answer, or the error mapped to a status the caller
// turns back into the same buckets sentinel.
func (h *Handler) reply(w http.ResponseWriter, r *http.Request, err error, body func() any) {
	var ve *buckets.ValidationError
	switch {
	case err == nil:
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(body()); err != nil {
			h.log.WarnContext(r.Context(), "write internal answer", "path", r.URL.Path, "err", err)
		}
	case errors.As(err, &ve) && ve.Code != "":
		writeJSONError(w, http.StatusBadRequest, errorResponse{Code: string(ve.Code), Message: ve.Msg, Field: ve.Field})
	case errors.Is(err, buckets.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, buckets.ErrInvalidArgument), errors.Is(err, buckets.ErrInvalidReading):
		writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
	default:
		h.log.ErrorContext(r.Context(), "internal call failed", "path", r.URL.Path, "err", err)
		writeError(w, http.StatusServiceUnavailable, "unavailable", "node: "+err.Error())
	}
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSONError(w, status, errorResponse{Code: code, Message: msg})
}

func writeJSONError(w http.ResponseWriter, status int, e errorResponse) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}
