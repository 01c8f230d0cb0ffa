package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// handleTables serves GET /v1/tables: every day table with its size,
// reading count (left out when unknown) and expiry time.
func (s *Server) handleTables(c echo.Context) error {
	tables, err := s.reader.Tables(c.Request().Context())
	if err != nil {
		return readerError(err, "list tables")
	}
	return sendJSON(c, func(b []byte) []byte {
		b = append(b, `{"tables":[`...)
		for i, t := range tables {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendTableHead(b, t.Day, t.SizeBytes, t.Readings)
			b = append(b, `,"expiresAt":`...)
			b = appendTicksTime(b, t.Day.End()+buckets.Ticks(s.retention/100))
			b = append(b, '}')
		}
		return append(b, "]}\n"...)
	})
}

// appendTableHead appends `{"day":...,"sizeBytes":n[,"readings":n]`
// without the closing brace; readings is left out when negative
// (unknown).
func appendTableHead(dst []byte, day buckets.Day, size, readings int64) []byte {
	dst = append(dst, `{"day":"`...)
	dst = day.Start().Time().AppendFormat(dst, buckets.DayLayout)
	dst = append(dst, `","sizeBytes":`...)
	dst = strconv.AppendInt(dst, size, 10)
	if readings >= 0 {
		dst = append(dst, `,"readings":`...)
		dst = strconv.AppendInt(dst, readings, 10)
	}
	return dst
}

// appendDrops appends `"dropped":[...]`.
func appendDrops(dst []byte, drops []buckets.TableDrop) []byte {
	dst = append(dst, `"dropped":[`...)
	for i, d := range drops {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendTableHead(dst, d.Day, d.SizeBytes, d.Readings)
		dst = append(dst, `,"reason":`...)
		dst = appendString(dst, d.Reason)
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

// errNoAdmin answers admin requests when no Admin is configured.
var errNoAdmin = &apiError{http.StatusNotImplemented, codeNotImplemented, "server: admin operations are not configured"}

// handleDropTable serves DELETE /v1/tables/{day} (admin).
func (s *Server) handleDropTable(c echo.Context) error {
	raw, err := pathParam(c, "day")
	if err != nil {
		return err
	}
	day, err := buckets.ParseDay(raw)
	if err != nil {
		return invalidArg("day", "%s", err.Error())
	}
	if s.admin == nil {
		return errNoAdmin
	}
	drop, err := s.admin.DropTable(c.Request().Context(), day)
	if errors.Is(err, buckets.ErrNotFound) {
		return notFound("day", "there is no table for %s", day)
	}
	if err != nil {
		return readerError(err, "drop table %s", day)
	}
	s.log.InfoContext(c.Request().Context(), "table dropped by admin request",
		"day", day.String(), "bytes", drop.SizeBytes, "remote", c.Request().RemoteAddr)
	return sendJSON(c, func(b []byte) []byte {
		b = append(b, '{')
		b = appendDrops(b, []buckets.TableDrop{drop})
		return append(b, "}\n"...)
	})
}

// handleRetention serves POST /v1/retention/run?dry_run=true (admin).
func (s *Server) handleRetention(c echo.Context) error {
	dry, err := boolParam(c, "dry_run")
	if err != nil {
		return err
	}
	if s.admin == nil {
		return errNoAdmin
	}
	rep, err := s.admin.RunRetention(c.Request().Context(), dry)
	if err != nil {
		return readerError(err, "run retention (dry run %t)", dry)
	}
	return sendJSON(c, func(b []byte) []byte {
		b = append(b, `{"dryRun":`...)
		b = strconv.AppendBool(b, rep.DryRun)
		b = append(b, `,"startedAt":`...)
		b = appendTime(b, rep.Started)
		b = append(b, `,"cutoff":`...)
		b = appendTime(b, rep.Cutoff)
		b = append(b, ',')
		b = appendDrops(b, rep.Dropped)
		b = append(b, `,"kept":`...)
		b = strconv.AppendInt(b, int64(rep.Kept), 10)
		b = append(b, `,"bytesNow":`...)
		b = strconv.AppendInt(b, rep.BytesNow, 10)
		return append(b, "}\n"...)
	})
}
