package api

import (
	"bytes"
	"context"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// warningHeader carries each warning of an answer (a damaged block the
// store skipped, say), one header line per warning, on every route;
// JSON answers of readings and aggregates also list them in
// "warnings", and PromQL answers in their own "warnings".
const warningHeader = "Telemetry-Warning"

// collectWarnings gives every request a collector for the warnings of
// its answer (buckets.WithWarnings) and sends them as warningHeader
// lines when the answer's headers go out.
func collectWarnings(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx, w := buckets.WithWarnings(c.Request().Context())
		c.SetRequest(c.Request().WithContext(ctx))
		res := c.Response()
		res.Before(func() {
			for _, m := range w.List() {
				res.Header().Add(warningHeader, m)
			}
		})
		return next(c)
	}
}

// withWarnings returns the JSON object answer b (ending in "}\n") with
// a "warnings" member listing the warnings collected for ctx, when
// there are any.
func withWarnings(ctx context.Context, b []byte) []byte {
	list := buckets.WarningsOf(ctx).List()
	if len(list) == 0 || !bytes.HasSuffix(b, []byte("}\n")) {
		return b
	}
	b = append(b[:len(b)-2], `,"warnings":[`...)
	for i, m := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, m)
	}
	return append(b, "]}\n"...)
}
