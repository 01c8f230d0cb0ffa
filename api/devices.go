package api

import (
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
	return sendJSON(c, func(b []byte) []byte { return appendDeviceList(b, devs, next) })
}

// appendDeviceList appends
// {"devices":[{"device","firstSeen","lastSeen","latest":{...}}],"next"}.
func appendDeviceList(dst []byte, devs []buckets.DeviceInfo, next string) []byte {
	dst = append(dst, `{"devices":[`...)
	for i := range devs {
		d := &devs[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"device":`...)
		dst = appendString(dst, string(d.Device))
		dst = append(dst, `,"firstSeen":`...)
		dst = appendTicksTime(dst, d.FirstSeen)
		dst = append(dst, `,"lastSeen":`...)
		dst = appendTicksTime(dst, d.LastSeen)
		dst = append(dst, `,"latest":`...)
		dst = appendValues(dst, sortedFields(d.Latest), nil)
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	dst = appendNext(dst, next)
	return append(dst, "}\n"...)
}
