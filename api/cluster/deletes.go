package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
)

// pathDeleteDevice deletes a device from the answering node's store.
const pathDeleteDevice = "/internal/v1/delete-device"

type deleteDeviceRequest struct {
	Device buckets.DeviceID `json:"device"`
}

// DeleteDevice deletes dev on every live node (each removes its copy
// and records its own tombstone). It reports the readings removed
// across the nodes (copies counted once per node); the error wraps
// buckets.ErrNotFound when no node knew the device, and names the
// nodes that failed (the delete is done on the others; repeating it is
// safe).
func (r *Router) DeleteDevice(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error) {
	total := buckets.DeviceDelete{Device: dev, Readings: -1}
	found := false
	var readings int64
	err := r.everyNode(ctx, func(p Peer) error {
		var d buckets.DeviceDelete
		var err error
		if p.Self {
			d, err = r.local.DeleteDevice(ctx, dev)
		} else {
			err = r.c.call(ctx, p.URL, pathDeleteDevice, deleteDeviceRequest{Device: dev}, &d)
		}
		if errors.Is(err, buckets.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		readings += max(d.Readings, 0)
		total.Tables = max(total.Tables, d.Tables)
		if d.Deleted.After(total.Deleted) {
			total.Deleted = d.Deleted
		}
		return nil
	})
	if found {
		total.Readings = readings
	}
	if err != nil {
		return total, err
	}
	if !found {
		return total, fmt.Errorf("device %s on no node: %w", dev, buckets.ErrNotFound)
	}
	return total, nil
}

func (h *Handler) deleteDevice(w http.ResponseWriter, r *http.Request) {
	var q deleteDeviceRequest
	if !decode(w, r, &q) || !allowed(w, r, auth.ScopeAdmin, q.Device) {
		return
	}
	d, err := h.local.DeleteDevice(r.Context(), q.Device)
	h.reply(w, r, err, func() any { return d })
}
