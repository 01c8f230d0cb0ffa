package api

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// handleTables serves GET /v1/tables: every day table with its size,
// reading count (left out when unknown) and the time the retention
// policy drops it.
func (s *Server) handleTables(c echo.Context) error {
	tables, err := s.reader.Tables(c.Request().Context())
	if err != nil {
		return readerError(err, "list tables")
	}
	out := TableList{Tables: make([]Table, len(tables))}
	for i, t := range tables {
		out.Tables[i] = Table{Day: t.Day.String(), SizeBytes: t.SizeBytes, Readings: knownCount(t.Readings)}
	}
	if s.expiresAt != nil {
		for i, at := range s.expiresAt(tables, s.now()) {
			at = at.UTC()
			out.Tables[i].ExpiresAt = &at
		}
	}
	return sendValue(c, http.StatusOK, out)
}

// errNoAdmin answers admin requests when no Admin is configured.
var errNoAdmin = &apiError{http.StatusNotImplemented, codeNotImplemented, "server: admin operations are not configured"}

// handleDropTable serves DELETE /v1/tables/{day} (admin). The drop is
// logged here, once, with who asked for it.
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
		"day", day.String(), "size_bytes", drop.SizeBytes, "readings", drop.Readings, "reason", drop.Reason,
		"remote", c.Request().RemoteAddr)
	return sendValue(c, http.StatusOK, DropResult{Dropped: droppedOf([]buckets.TableDrop{drop})})
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
	return sendValue(c, http.StatusOK, RetentionRun{
		DryRun:    rep.DryRun,
		StartedAt: rep.Started.UTC(),
		Cutoff:    rep.Cutoff.UTC(),
		Dropped:   droppedOf(rep.Dropped),
		Kept:      rep.Kept,
		BytesNow:  rep.BytesNow,
	})
}
