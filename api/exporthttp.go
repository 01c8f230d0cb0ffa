package api

import (
	"encoding/binary"
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// exportNextHeader is the trailer that carries the cursor of the rest
// of a limited export.
const exportNextHeader = "Export-Next"

// cursorKindExport marks an export cursor.
const cursorKindExport = 'x'

// exportCursor is the state of a limited export: the query as resolved
// by its first response and the last reading delivered.
type exportCursor struct {
	Format byte
	Prefix string
	Match  string
	From   buckets.Ticks
	To     buckets.Ticks
	Pos    exportPos
}

// encodeExport returns the cursor string of c.
func (cc cursorCodec) encodeExport(c exportCursor) string {
	b := make([]byte, 0, 48+len(c.Prefix)+len(c.Match)+buckets.MaxDeviceIDLen)
	b = append(b, cursorVersion, cursorKindExport, c.Format)
	b = appendBytes(b, c.Prefix)
	b = appendBytes(b, c.Match)
	b = binary.BigEndian.AppendUint64(b, uint64(c.From))
	b = binary.BigEndian.AppendUint64(b, uint64(c.To))
	b = appendBytes(b, string(c.Pos.Device))
	b = binary.BigEndian.AppendUint64(b, uint64(c.Pos.Last))
	return cc.seal(b)
}

// decodeExport checks and decodes an export cursor.
func (cc cursorCodec) decodeExport(s string) (exportCursor, error) {
	p, err := cc.open(s, cursorKindExport)
	if err != nil {
		return exportCursor{}, err
	}
	r := newCursorReader(p)
	var c exportCursor
	c.Format = r.Byte()
	c.Prefix = r.str()
	c.Match = r.str()
	c.From = buckets.Ticks(r.u64())
	c.To = buckets.Ticks(r.u64())
	c.Pos.Device = buckets.DeviceID(r.str())
	c.Pos.Last = buckets.Ticks(r.u64())
	if r.Failed() || r.Len() != 0 || (c.Format != 'n' && c.Format != 'c') || validPrefix(c.Prefix) != nil ||
		len(c.Match) > maxMatchBytes || !c.From.Valid() || !c.To.Valid() || c.From >= c.To ||
		c.Pos.Device.Validate() != nil || c.Pos.Last < c.From || c.Pos.Last >= c.To {
		return exportCursor{}, invalidArg("cursor", "malformed; pass the %s value of the previous response unchanged", exportNextHeader)
	}
	return c, nil
}

// handleExport serves GET /v1/export?match=&prefix=&from=&to=&format=&limit=&cursor=:
// the readings of every device the token may see that match selects,
// devices in ID order, each device's readings oldest first, streamed
// as NDJSON (one reading per line) or CSV (one value per row). With
// limit, at most that many readings are sent and, when more remain,
// a cursor that resumes right behind the last one (a last NDJSON line
// {"next":...} and the trailer Export-Next).
//
// An export holds one query slot and a full range page of the response
// budget while it runs. -query-timeout bounds each read of the store,
// not the stream: an export runs as long as it makes progress and its
// client takes every chunk within the stall timeout. A failure after
// the first byte aborts the response, so the client sees a broken
// transfer instead of a short export that looks complete.
func (s *Server) handleExport(c echo.Context) error {
	x, cur, err := s.exportRequest(c)
	if err != nil {
		return err
	}
	res, err := s.reserve(c, exportPage)
	if err != nil {
		return err
	}
	defer res.release()
	ctx := c.Request().Context()
	var w *chunkWriter
	start := func() {
		h := c.Response().Header()
		if x.spec.CSV {
			h.Set(echo.HeaderContentType, "text/csv; charset=utf-8; header=present")
		} else {
			h.Set(echo.HeaderContentType, "application/x-ndjson")
		}
		h.Set("Trailer", exportNextHeader)
		c.Response().WriteHeader(http.StatusOK)
		w = &chunkWriter{c: c, rc: http.NewResponseController(c.Response()), stall: s.stallTimeout,
			head: c.Request().Method == http.MethodHead, s: s}
	}
	x.emit = func(b []byte) error {
		if w == nil {
			start()
		}
		if err := w.write(b); err != nil {
			return err
		}
		if err := w.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return errCutOff
		}
		return nil
	}
	err = x.run(ctx)
	switch {
	case err == nil:
	case errors.Is(err, errCutOff), ctx.Err() != nil:
		return nil // the client is gone or was cut off; nothing more to say
	case w == nil:
		return err
	default:
		s.log.ErrorContext(ctx, "export failed mid-stream", "err", err, "readings", x.n)
		panic(http.ErrAbortHandler)
	}
	if w == nil {
		start()
	}
	if x.more {
		cur.Pos = x.pos
		next := s.cursors.encodeExport(cur)
		if !x.spec.CSV {
			line := appendString([]byte(`{"next":`), next)
			if err := w.write(append(line, "}\n"...)); err != nil {
				return nil
			}
		}
		c.Response().Header().Set(exportNextHeader, next)
	}
	return nil
}

// exportRequest resolves the parameters of an export. With a cursor,
// the cursor's query holds and explicit parameters must agree with it.
func (s *Server) exportRequest(c echo.Context) (*exporter, exportCursor, error) {
	format := c.QueryParam("format")
	if format == "" {
		format = FormatNDJSON
	}
	fb, ok := exportFormat(format)
	if !ok {
		return nil, exportCursor{}, invalidArg("format", `must be "ndjson" or "csv", got %s`, quoted(format))
	}
	prefix := c.QueryParam("prefix")
	if err := validPrefix(prefix); err != nil {
		return nil, exportCursor{}, err
	}
	match := c.QueryParam("match")
	if _, err := parseMatch(match); err != nil {
		return nil, exportCursor{}, err
	}
	from, hasFrom, err := timeParam(c, "from")
	if err != nil {
		return nil, exportCursor{}, err
	}
	to, hasTo, err := timeParam(c, "to")
	if err != nil {
		return nil, exportCursor{}, err
	}
	var limit int64
	if ls := c.QueryParam("limit"); ls != "" {
		limit, err = strconv.ParseInt(ls, 10, 64)
		if err != nil || limit < 1 {
			return nil, exportCursor{}, invalidArg("limit", "must be an integer from 1 to %d, got %s", int64(math.MaxInt64), quoted(ls))
		}
	}
	var cur exportCursor
	var after *exportPos
	if cs := c.QueryParam("cursor"); cs != "" {
		cur, err = s.cursors.decodeExport(cs)
		if err != nil {
			return nil, exportCursor{}, err
		}
		switch {
		case c.QueryParam("format") != "" && fb != cur.Format, prefix != "" && prefix != cur.Prefix,
			match != "" && match != cur.Match, hasFrom && from != cur.From, hasTo && to != cur.To:
			return nil, exportCursor{}, invalidArg("cursor", "belongs to another export; repeat the first request's format, prefix, match, from and to, or leave them out")
		}
		pos := cur.Pos
		after = &pos
	} else {
		if !hasTo {
			if to, err = s.defaultTo(); err != nil {
				return nil, exportCursor{}, err
			}
		}
		if from >= to {
			return nil, exportCursor{}, invalidArg("from", "%s is not before to %s", from.FormatTime(), to.FormatTime())
		}
		cur = exportCursor{Format: fb, Prefix: prefix, Match: match, From: from, To: to}
	}
	ms, err := parseMatch(cur.Match)
	if err != nil {
		return nil, exportCursor{}, err
	}
	x := &exporter{r: s.reader, callTimeout: s.queryTimeout, spec: exportSpec{
		Prefix: cur.Prefix, Match: ms, From: cur.From, To: cur.To, CSV: cur.Format == 'c',
		Limit: limit, Visible: visibleOf(c.Request().Context()), After: after}}
	return x, cur, nil
}
