package api

import (
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// Parameter parsing. Every error is a 400 invalid_argument whose
// message starts with the parameter name. Query parameters that are
// empty count as absent (so `?from=&to=` means the defaults), unknown
// ones are ignored, fields may be repeated (its lists are joined), and
// of any other repeated one the first wins.

// Limits of the limit parameters (api/README.md).
const (
	maxLatestLimit      = 1000
	defaultLatestLimit  = 10
	maxRangeLimit       = 10000
	defaultRangeLimit   = 1000
	maxDevicesLimit     = 1000
	defaultDevicesLimit = 100
)

// maxEcho bounds how much of a bad input an error message repeats.
const maxEcho = 64

// quoted renders user input for an error message, cut to maxEcho bytes.
func quoted(s string) string {
	if len(s) > maxEcho {
		return strconv.Quote(s[:maxEcho]) + "..."
	}
	return strconv.Quote(s)
}

// pathParam returns the path parameter name, percent-decoded. Echo
// routes on the raw (escaped) path, so an encoded slash stays inside
// its segment and reaches the validation below as a '/'.
func pathParam(c echo.Context, name string) (string, error) {
	raw := c.Param(name)
	s, err := url.PathUnescape(raw)
	if err != nil {
		return "", invalidArg(name, "bad percent-encoding in %s", quoted(raw))
	}
	return s, nil
}

// deviceParam validates the {device} path segment.
func deviceParam(c echo.Context) (buckets.DeviceID, error) {
	s, err := pathParam(c, "device")
	if err != nil {
		return "", err
	}
	dev, err := buckets.ParseDeviceID(s)
	if err != nil {
		return "", invalidArg("device", "%s", validationMsg(err))
	}
	return dev, nil
}

// validationMsg returns the detail of a buckets.ValidationError without
// its field prefix (the caller names the parameter), or err's text.
func validationMsg(err error) string {
	var ve *buckets.ValidationError
	if errors.As(err, &ve) {
		return ve.Msg
	}
	return err.Error()
}

// limitParam parses limit in 1..max, def when absent.
func limitParam(c echo.Context, def, max int) (int, error) {
	s := c.QueryParam("limit")
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > max {
		return 0, invalidArg("limit", "must be an integer from 1 to %d, got %s", max, quoted(s))
	}
	return n, nil
}

// parseTime parses an RFC 3339 time or epoch milliseconds for param. A
// space is read back as '+': RFC 3339 has no spaces, so a space can
// only be a '+' offset that was not percent-encoded in the query.
func parseTime(param, s string) (buckets.Ticks, error) {
	k, err := buckets.ParseTime(strings.ReplaceAll(s, " ", "+"))
	if err != nil {
		if len(s) > maxEcho {
			return 0, invalidArg(param, "cannot parse %s as RFC 3339 or epoch milliseconds", quoted(s))
		}
		return 0, invalidArg(param, "%s", err.Error())
	}
	return k, nil
}

// timeParam parses an optional time query parameter.
func timeParam(c echo.Context, name string) (k buckets.Ticks, ok bool, err error) {
	s := c.QueryParam(name)
	if s == "" {
		return 0, false, nil
	}
	k, err = parseTime(name, s)
	return k, err == nil, err
}

// orderParam parses order: desc (default) or asc.
func orderParam(c echo.Context) (o buckets.Order, ok bool, err error) {
	switch s := c.QueryParam("order"); s {
	case "":
		return buckets.Desc, false, nil
	case "desc":
		return buckets.Desc, true, nil
	case "asc":
		return buckets.Asc, true, nil
	default:
		return 0, false, invalidArg("order", `must be "desc" or "asc", got %s`, quoted(s))
	}
}

// fieldsParam parses fields=a,b (or fields=a&fields=b, or both) into a
// sorted, unique list of value names; nil when absent (all values).
// Projection keeps only these names in "values"; names a reading lacks
// are left out, and a reading with none of them is still returned, with
// an empty values object.
func fieldsParam(c echo.Context) ([]string, error) {
	var names []string
	for _, s := range c.QueryParams()["fields"] {
		if s != "" {
			names = append(names, strings.Split(s, ",")...)
		}
	}
	if names == nil {
		return nil, nil
	}
	if len(names) > buckets.MaxValues {
		return nil, invalidArg("fields", "%d names is more than %d", len(names), buckets.MaxValues)
	}
	for _, n := range names {
		if err := buckets.ValidateValueName(n); err != nil {
			return nil, invalidArg("fields", "%s: %s", quoted(n), validationMsg(err))
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// validPrefix checks a device-ID prefix: empty, or itself a valid
// device ID (every non-empty prefix of a valid ID is one).
func validPrefix(p string) error {
	if p == "" {
		return nil
	}
	if err := buckets.DeviceID(p).Validate(); err != nil {
		return invalidArg("prefix", "%s", validationMsg(err))
	}
	return nil
}

// boolParam parses an optional boolean (true/false/1/0).
func boolParam(c echo.Context, name string) (bool, error) {
	s := c.QueryParam(name)
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, invalidArg(name, "must be true or false, got %s", quoted(s))
	}
	return b, nil
}
