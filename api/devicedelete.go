package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// devicePath is the route of one device: GET reads it (scope read),
// DELETE deletes it (scope admin).
const devicePath = "/v1/devices/:device"

// DeviceDeleteResult is the answer of DELETE /v1/devices/{device}.
type DeviceDeleteResult struct {
	Device string `json:"device"`
	// Deleted is the time of the delete's tombstone: messages the
	// stream stored before it are not written again.
	Deleted time.Time `json:"deleted"`
	// Readings is how many readings were removed (in a cluster, summed
	// over the nodes' copies); absent when not known.
	Readings *int64 `json:"readings,omitempty"`
	// Tables is how many day tables held readings of the device (in a
	// cluster, on the node that held it in the most).
	Tables int `json:"tables"`
}

// handleDeleteDevice serves DELETE /v1/devices/{device} (admin): the
// device's readings, latest values, record and attributes go, on every
// node of a cluster. The delete is logged here, once, with who asked.
func (s *Server) handleDeleteDevice(c echo.Context) error {
	dev, err := deviceParam(c)
	if err != nil {
		return err
	}
	if s.admin == nil {
		return errNoAdmin
	}
	ctx := c.Request().Context()
	d, err := s.admin.DeleteDevice(ctx, dev)
	if errors.Is(err, buckets.ErrNotFound) {
		return notFound("device", "%q is not known", dev)
	}
	if err != nil {
		return readerError(err, "delete device %s", dev)
	}
	s.log.InfoContext(ctx, "device deleted by admin request", "device", string(dev), "readings", d.Readings,
		"tables", d.Tables, "deleted", d.Deleted, "remote", c.Request().RemoteAddr)
	return sendValue(c, http.StatusOK, DeviceDeleteResult{Device: string(d.Device), Deleted: d.Deleted.UTC(),
		Readings: knownCount(d.Readings), Tables: d.Tables})
}
