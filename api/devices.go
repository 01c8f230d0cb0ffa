package api

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/api/auth"

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
	devs, last, more, err := s.visibleDevices(c.Request().Context(), prefix, after, limit)
	if err != nil {
		return readerError(err, "list devices with prefix %q", prefix)
	}
	next := ""
	if more && last != "" {
		next = s.cursors.encodeDevices(devicesCursor{Prefix: prefix, Last: last})
	}
	out := DeviceList{Devices: make([]Device, len(devs)), Next: next}
	for i := range devs {
		out.Devices[i] = deviceOf(&devs[i])
	}
	return sendValue(c, http.StatusOK, out)
}

// maxDeviceScan bounds the devices one listing reads from the index
// when the token sees only some of them; past it the page is returned
// short, with a cursor.
const maxDeviceScan = 10 * maxDevicesLimit

// visibleDevices lists up to limit devices the request may see
// (auth.Visible), reading further pages of the index while devices are
// filtered out, at most maxDeviceScan of them. last is the last device
// read, where a next page starts: after a scan that found too few
// visible devices it may be one the request cannot see, which is why
// cursors are sealed (cursor.go) and show nothing of it.
func (s *Server) visibleDevices(ctx context.Context, prefix string, after buckets.DeviceID, limit int) (
	devs []buckets.DeviceInfo, last buckets.DeviceID, more bool, err error) {
	p := auth.FromContext(ctx)
	if p.AllDevices() {
		devs, more, err = s.reader.Devices(ctx, buckets.DeviceQuery{Prefix: prefix, After: after, Limit: limit})
		if len(devs) > 0 {
			last = devs[len(devs)-1].Device
		}
		return devs, last, more, err
	}
	last = after
	for scanned := 0; scanned < maxDeviceScan; {
		page, pageMore, err := s.reader.Devices(ctx, buckets.DeviceQuery{Prefix: prefix, After: last, Limit: limit - len(devs)})
		if err != nil {
			return nil, "", false, err
		}
		scanned += len(page)
		for _, d := range page {
			last = d.Device
			if p.DeviceVisible(string(d.Device)) {
				devs = append(devs, d)
			}
		}
		if !pageMore || len(page) == 0 {
			return devs, last, false, nil
		}
		if len(devs) == limit {
			return devs, last, true, nil
		}
	}
	return devs, last, true, nil
}
