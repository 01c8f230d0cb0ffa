package api

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
)

// maxMatchBytes bounds the match parameter of a device listing.
const maxMatchBytes = 4096

// handleDevices serves GET /v1/devices?prefix=&match=&silent_for=&limit=&cursor=:
// known devices sorted by ID with their attributes, first seen, last
// seen and latest values; match keeps devices whose attributes satisfy
// a Prometheus selector, silent_for those whose last reading is older.
func (s *Server) handleDevices(c echo.Context) error {
	prefix := c.QueryParam("prefix")
	if err := validPrefix(prefix); err != nil {
		return err
	}
	limit, err := limitParam(c, defaultDevicesLimit, maxDevicesLimit)
	if err != nil {
		return err
	}
	f, err := s.deviceFilterParams(c)
	if err != nil {
		return err
	}
	var after buckets.DeviceID
	if cur := c.QueryParam("cursor"); cur != "" {
		dc, err := s.cursors.decodeDevices(cur)
		if err != nil {
			return err
		}
		switch {
		case prefix != "" && prefix != dc.Prefix:
			return invalidArg("cursor", "belongs to prefix %q, not %q", dc.Prefix, prefix)
		case f.Match != "" && f.Match != dc.Filter.Match:
			return invalidArg("cursor", "belongs to match %s, not %s", quoted(dc.Filter.Match), quoted(f.Match))
		case f.SilentFor != 0 && f.SilentFor != dc.Filter.SilentFor:
			return invalidArg("cursor", "belongs to silent_for %s, not %s", dc.Filter.SilentFor, f.SilentFor)
		}
		prefix, after, f = dc.Prefix, dc.Last, dc.Filter
	}
	ms, err := parseMatch(f.Match)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	q := buckets.DeviceQuery{Prefix: prefix, After: after, Limit: limit, Match: ms,
		SilentBefore: f.SilentBefore, Visible: visibleOf(ctx)}
	devs, last, more, err := s.listDevices(ctx, q, f.Since)
	if err != nil {
		return readerError(err, "list devices with prefix %q", prefix)
	}
	next := ""
	if more && last != "" {
		next = s.cursors.encodeDevices(devicesCursor{Prefix: prefix, Last: last, Filter: f})
	}
	out := DeviceList{Devices: make([]Device, len(devs)), Next: next}
	for i := range devs {
		out.Devices[i] = deviceOf(&devs[i])
	}
	return sendValue(c, http.StatusOK, out)
}

// visibleOf is the DeviceQuery.Visible of the request of ctx: nil when
// its token sees every device (the store then needs no check per
// device).
func visibleOf(ctx context.Context) func(buckets.DeviceID) bool {
	p := auth.FromContext(ctx)
	if p.AllDevices() {
		return nil
	}
	return func(d buckets.DeviceID) bool { return p.DeviceVisible(string(d)) }
}

// deviceFilterParams reads match and silent_for. silent_for resolves
// against the clock now: devices last seen before now - silent_for and,
// when the server knows its retention, not before now - retention (a
// device whose readings have all expired is gone, not silent). A device
// that never sent a reading is never silent.
func (s *Server) deviceFilterParams(c echo.Context) (deviceFilter, error) {
	f := deviceFilter{Match: c.QueryParam("match")}
	if _, err := parseMatch(f.Match); err != nil {
		return f, err
	}
	sf := c.QueryParam("silent_for")
	if sf == "" {
		return f, nil
	}
	d, err := parseInterval(sf)
	if err != nil {
		return f, invalidArg("silent_for", "%s", err.Error())
	}
	if s.retention > 0 && d >= s.retention {
		return f, invalidArg("silent_for", "%s is not shorter than the retention (%s): a device last seen that long ago is gone, not silent", sf, s.retention)
	}
	now := s.now()
	f.SilentFor = d
	if f.SilentBefore, err = buckets.TicksOf(now.Add(-d)); err != nil {
		return f, invalidArg("silent_for", "%s reaches before the year 1", sf)
	}
	f.Since = 1 // last seen at all
	if k, err := buckets.TicksOf(now.Add(-s.retention)); s.retention > 0 && err == nil {
		f.Since = max(1, k)
	}
	return f, nil
}

// parseMatch parses the match parameter: a Prometheus series selector
// over attributes and the label device, such as
// {fleet="East",model=~"F-.*"}. Empty means no filter.
func parseMatch(s string) ([]*buckets.Matcher, error) {
	if s == "" {
		return nil, nil
	}
	if len(s) > maxMatchBytes {
		return nil, invalidArg("match", "is %d bytes, at most %d are allowed", len(s), maxMatchBytes)
	}
	ms, err := parser.NewParser(parser.Options{}).ParseMetricSelector(s)
	if err != nil {
		return nil, invalidArg("match", "%s: %v", quoted(s), err)
	}
	for _, m := range ms {
		switch {
		case m.Name == model.MetricNameLabel:
			return nil, invalidArg("match", "%s: devices have no metric name; match their attributes or device", m)
		case m.Name == deviceLabel:
		case buckets.ValidateAttributeName(m.Name) != nil:
			return nil, invalidArg("match", "%s: %s is not an attribute name: %s", m, quoted(m.Name),
				buckets.ValidateAttributeName(m.Name).Msg)
		}
	}
	out := make([]*buckets.Matcher, len(ms))
	for i, m := range ms {
		if out[i], err = buckets.NewMatcher(buckets.MatchType(m.Type), m.Name, m.Value); err != nil {
			return nil, invalidArg("match", "%s: %v", quoted(s), err)
		}
	}
	return out, nil
}

// deviceLabel is the matcher name that matches the device ID.
const deviceLabel = "device"

// maxDeviceScan bounds the devices one listing reads from the index
// when some of those the store selects are left out here (devices whose
// readings have all expired, for silent_for); past it the page is
// returned short, with a cursor.
const maxDeviceScan = 10 * maxDevicesLimit

// listDevices lists up to q.Limit devices that q selects and that were
// last seen at or after since (0: any). The store applies q whole
// (attributes, silence, the token's patterns); only since is checked
// here, reading further pages while devices are left out, at most
// maxDeviceScan of them. last is the last device read, where a next
// page starts.
func (s *Server) listDevices(ctx context.Context, q buckets.DeviceQuery, since buckets.Ticks) (
	devs []buckets.DeviceInfo, last buckets.DeviceID, more bool, err error) {
	if since == 0 {
		devs, more, err = s.reader.Devices(ctx, q)
		if len(devs) > 0 {
			last = devs[len(devs)-1].Device
		}
		return devs, last, more, err
	}
	limit := q.Limit
	last = q.After
	for scanned := 0; scanned < maxDeviceScan; {
		q.After, q.Limit = last, limit-len(devs)
		page, pageMore, err := s.reader.Devices(ctx, q)
		if err != nil {
			return nil, "", false, err
		}
		scanned += len(page)
		for _, d := range page {
			last = d.Device
			if d.LastSeen >= since {
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
