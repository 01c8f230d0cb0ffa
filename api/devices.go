package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// handleDevices serves GET /v1/devices?prefix=&limit=&cursor=: known
// devices sorted by ID with first seen, last seen and latest values.
func (s *Server) handleDevices(c echo.Context) error {
	prefix := c.QueryParam("prefix")
	if err := validPrefix(prefix); err != nil {
		return err
	}
	limit, err := limitParam(c, defaultDevicesLimit, maxDevicesLimit)
	if err != nil {
		return err
	}
	var after buckets.DeviceID
	if cur := c.QueryParam("cursor"); cur != "" {
		dc, err := s.cursors.decodeDevices(cur)
		if err != nil {
			return err
		}
		if prefix != "" && prefix != dc.Prefix {
			return invalidArg("cursor", "belongs to prefix %q, not %q", dc.Prefix, prefix)
		}
		prefix, after = dc.Prefix, dc.Last
	}
	devs, more, err := s.reader.Devices(c.Request().Context(), prefix, after, limit)
	if err != nil {
		return readerError(err, "list devices with prefix %q", prefix)
	}
	next := ""
	if more && len(devs) > 0 {
		next = s.cursors.encodeDevices(devicesCursor{Prefix: prefix, Last: devs[len(devs)-1].Device})
	}
	out := DeviceList{Devices: make([]Device, len(devs)), Next: next}
	for i := range devs {
		out.Devices[i] = deviceOf(&devs[i])
	}
	return sendValue(c, http.StatusOK, out)
}
