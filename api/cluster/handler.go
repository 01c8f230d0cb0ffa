package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"

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
)

// maxRequestBytes bounds an internal request body.
const maxRequestBytes = 64 << 10

// Handler serves the node-to-node API from this node's own store:
// every call is answered locally, never forwarded again. The API's
// authentication runs first (admin scope); a token limited to some
// devices is refused here, since these calls see every device.
type Handler struct {
	local Local
	part  func(buckets.DeviceID) int
	log   *slog.Logger
	mux   *http.ServeMux
}

// NewHandler serves local; part maps a device to its partition.
func NewHandler(local Local, part func(buckets.DeviceID) int, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.Default()
	}
	h := &Handler{local: local, part: part, log: log, mux: http.NewServeMux()}
	h.mux.HandleFunc("POST "+pathLatest, h.latest)
	h.mux.HandleFunc("POST "+pathRange, h.rangeQ)
	h.mux.HandleFunc("POST "+pathGet, h.get)
	h.mux.HandleFunc("POST "+pathDevices, h.devices)
	h.mux.HandleFunc("POST "+pathAggregate, h.aggregate)
	h.mux.HandleFunc("GET "+pathTables, h.tables)
	h.mux.HandleFunc("POST "+pathDrop, h.drop)
	return h
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p := auth.FromContext(r.Context()); !p.AllDevices() {
		writeError(w, http.StatusForbidden, "permission_denied", "authorization: the node-to-node API needs a token that covers every device")
		return
	}
	h.mux.ServeHTTP(w, r)
}

func (h *Handler) latest(w http.ResponseWriter, r *http.Request) {
	var q latestRequest
	if !decode(w, r, &q) {
		return
	}
	rs, err := h.local.Latest(r.Context(), q.Device, q.N)
	h.reply(w, r, err, func() any { return readingsResponse{Readings: toWire(rs)} })
}

func (h *Handler) rangeQ(w http.ResponseWriter, r *http.Request) {
	var q buckets.RangeQuery
	if !decode(w, r, &q) {
		return
	}
	p, err := h.local.Range(r.Context(), q)
	h.reply(w, r, err, func() any { return readingsResponse{Readings: toWire(p.Readings), More: p.More} })
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	var q getRequest
	if !decode(w, r, &q) {
		return
	}
	rd, err := h.local.Get(r.Context(), q.Device, q.Ticks)
	h.reply(w, r, err, func() any { return readingsResponse{Readings: toWire([]buckets.Reading{rd})} })
}

func (h *Handler) aggregate(w http.ResponseWriter, r *http.Request) {
	var q buckets.AggregateQuery
	if !decode(w, r, &q) {
		return
	}
	p, err := h.local.Aggregate(r.Context(), q)
	h.reply(w, r, err, func() any { return p })
}

func (h *Handler) devices(w http.ResponseWriter, r *http.Request) {
	var q devicesRequest
	if !decode(w, r, &q) {
		return
	}
	devs, more, err := localDevices(r.Context(), h.local, h.part, q)
	h.reply(w, r, err, func() any {
		out := devicesResponse{Devices: make([]wireDevice, len(devs)), More: more}
		for i, d := range devs {
			out.Devices[i] = wireDevice{Device: d.Device, FirstSeen: d.FirstSeen, LastSeen: d.LastSeen,
				Latest: buckets.AppendValues(nil, d.Latest)}
		}
		return out
	})
}

func (h *Handler) tables(w http.ResponseWriter, r *http.Request) {
	ts, err := h.local.Tables(r.Context())
	h.reply(w, r, err, func() any { return tablesResponse{Tables: ts} })
}

func (h *Handler) drop(w http.ResponseWriter, r *http.Request) {
	var q dropRequest
	if !decode(w, r, &q) {
		return
	}
	d, err := h.local.DropTable(r.Context(), q.Day)
	h.reply(w, r, err, func() any { return d })
}

// localDevices lists the devices of q.Partitions in the local index,
// reading the index in pages until q.Limit of them are found.
func localDevices(ctx context.Context, local Local, part func(buckets.DeviceID) int, q devicesRequest) ([]buckets.DeviceInfo, bool, error) {
	if q.Limit < 1 {
		return nil, false, fmt.Errorf("limit %d: %w", q.Limit, buckets.ErrInvalidArgument)
	}
	var out []buckets.DeviceInfo
	after := q.After
	for {
		page, more, err := local.Devices(ctx, q.Prefix, after, q.Limit)
		if err != nil {
			return nil, false, err
		}
		for _, d := range page {
			if !slices.Contains(q.Partitions, part(d.Device)) {
				continue
			}
			if len(out) == q.Limit {
				return out, true, nil
			}
			out = append(out, d)
		}
		if !more || len(page) == 0 {
			return out, false, nil
		}
		after = page[len(page)-1].Device
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
	switch {
	case err == nil:
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(body()); err != nil {
			h.log.WarnContext(r.Context(), "write internal answer", "path", r.URL.Path, "error", err)
		}
	case errors.Is(err, buckets.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, buckets.ErrInvalidArgument), errors.Is(err, buckets.ErrInvalidReading):
		writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
	default:
		h.log.ErrorContext(r.Context(), "internal call failed", "path", r.URL.Path, "error", err)
		writeError(w, http.StatusServiceUnavailable, "unavailable", "node: "+err.Error())
	}
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(errorResponse{Code: code, Message: msg})
}
