package api

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/lineproto"
)

// Publisher stores messages in JetStream (implemented in the service
// binary over a NATS connection). Publish returns once every message
// is acknowledged by its stream, or with the first error; messages
// carry a Nats-Msg-Id, so publishing one twice stores it once.
type Publisher interface {
	Publish(ctx context.Context, msgs []lineproto.Message) error
}

// Defaults of WriteConfig.
const (
	DefaultMaxWriteBytes = 16 << 20
	// publishTimeout bounds the publishing of one write request.
	publishTimeout = 30 * time.Second
	// maxNamedLines is how many rejected lines a 400 names.
	maxNamedLines = 3
)

// WriteConfig configures the InfluxDB line protocol write endpoints
// (DESIGN §9): POST /api/v2/write, POST /write and POST /query.
type WriteConfig struct {
	// Publisher stores the mapped messages; nil makes the write
	// endpoints answer 501.
	Publisher Publisher
	// SubjectPrefix: readings go to <prefix>.<device>. Default
	// "telemetry".
	SubjectPrefix string
	// DeviceTags: the first of these tags present on a line names its
	// device. Default device, host.
	DeviceTags []string
	// MaxBytes bounds a body before and after gunzip (413 beyond).
	// Default DefaultMaxWriteBytes.
	MaxBytes int64
	// MaxMessageBytes bounds one published message (the NATS server's
	// max payload). Default lineproto.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Window is the accepted time window, the ingester's; each zero
	// half takes its buckets default.
	Window buckets.Window
}

// writer serves the write endpoints.
type writer struct {
	cfg WriteConfig
	now func() time.Time
}

// writePaths are the routes that enforce their own body limit
// (WriteConfig.MaxBytes) instead of MaxBodyBytes.
var writePaths = map[string]bool{"/api/v2/write": true, "/write": true}

func newWriter(cfg *WriteConfig, now func() time.Time) *writer {
	w := &writer{now: now}
	if cfg != nil {
		w.cfg = *cfg
	}
	w.cfg.SubjectPrefix = cmp.Or(w.cfg.SubjectPrefix, "telemetry")
	w.cfg.MaxBytes = cmp.Or(w.cfg.MaxBytes, DefaultMaxWriteBytes)
	w.cfg.MaxMessageBytes = cmp.Or(w.cfg.MaxMessageBytes, lineproto.DefaultMaxMessageBytes)
	w.cfg.Window.Retention = cmp.Or(w.cfg.Window.Retention, buckets.DefaultRetention)
	w.cfg.Window.MaxFutureSkew = cmp.Or(w.cfg.Window.MaxFutureSkew, buckets.DefaultMaxFutureSkew)
	if len(w.cfg.DeviceTags) == 0 {
		w.cfg.DeviceTags = []string{"device", "host"}
	}
	return w
}

// registerWriteRoutes adds the line protocol endpoints. Authorization
// of writes belongs in middleware on these routes.
func (s *Server) registerWriteRoutes(e *echo.Echo) {
	e.POST("/api/v2/write", func(c echo.Context) error { return s.writes.write(c, false) })
	e.POST("/write", func(c echo.Context) error { return s.writes.write(c, true) })
	e.POST("/query", s.writes.query)
}

// influxError is the InfluxDB error body {"code":..,"message":..}; on
// the 1.x endpoint it also carries the message as "error", where 1.x
// clients (Telegraf's influxdb output) read it.
type influxError struct {
	status int
	Code   string `json:"code"`
	Msg    string `json:"message"`
	V1     string `json:"error,omitempty"`
}

func (e *influxError) Error() string { return e.Msg }

func influxErr(status int, code, format string, args ...any) *influxError {
	return &influxError{status: status, Code: code, Msg: fmt.Sprintf(format, args...)}
}

// write serves POST /api/v2/write (v1 false) and POST /write (v1 true).
func (w *writer) write(c echo.Context, v1 bool) error {
	if err := w.serveWrite(c, v1); err != nil {
		var ie *influxError
		if !errors.As(err, &ie) {
			ie = influxErr(http.StatusInternalServerError, "internal error", "internal error")
		}
		if v1 {
			ie.V1 = ie.Msg
		}
		if ie.status == http.StatusServiceUnavailable {
			c.Response().Header().Set("Retry-After", "1")
		}
		return c.JSON(ie.status, ie)
	}
	return c.NoContent(http.StatusNoContent)
}

func (w *writer) serveWrite(c echo.Context, v1 bool) error {
	if w.cfg.Publisher == nil {
		return influxErr(http.StatusNotImplemented, "not implemented", "writes are not enabled on this instance")
	}
	req := c.Request()
	precision, err := lineproto.ParsePrecision(req.URL.Query().Get("precision"), v1)
	if err != nil {
		return influxErr(http.StatusBadRequest, "invalid", "%s", err.Error())
	}
	body, err := w.readBody(req)
	if err != nil {
		return err
	}
	// Nothing Map returns refers to the body: its buffer goes back to
	// the pool once the lines are mapped.
	defer putBuffer(body)
	res := lineproto.Map(body.Bytes(), lineproto.Options{
		SubjectPrefix:   w.cfg.SubjectPrefix,
		DeviceTags:      w.cfg.DeviceTags,
		Precision:       precision,
		Now:             w.now(),
		Window:          w.cfg.Window,
		MaxMessageBytes: w.cfg.MaxMessageBytes,
		Allow:           func(dev string) bool { return auth.Visible(req.Context(), dev) },
	})
	ctx, cancel := context.WithTimeout(req.Context(), publishTimeout)
	defer cancel()
	msgs := append(res.Messages, res.DeadLetters...)
	if err := w.cfg.Publisher.Publish(ctx, msgs); err != nil {
		return influxErr(http.StatusServiceUnavailable, "unavailable",
			"not every line was stored (%s); retry the request: lines already stored are not stored twice", err.Error())
	}
	if len(res.Rejected) > 0 {
		if res.Readings == 0 && allDenied(res.Rejected) {
			return influxErr(http.StatusForbidden, "forbidden", "%s", partialWrite(res))
		}
		return influxErr(http.StatusBadRequest, "invalid", "%s", partialWrite(res))
	}
	return nil
}

// allDenied reports whether every rejection is a device the token may
// not write.
func allDenied(les []lineproto.LineError) bool {
	for _, le := range les {
		if le.Err.Code != lineproto.CodeDeviceNotAllowed {
			return false
		}
	}
	return true
}

// partialWrite is "partial write: X of Y lines rejected; line N: ...".
func partialWrite(res lineproto.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "partial write: %d of %d lines rejected", len(res.Rejected), res.Lines)
	for i, le := range res.Rejected {
		if i == maxNamedLines {
			b.WriteString("; ...")
			break
		}
		b.WriteString("; ")
		b.WriteString(le.Error())
		b.WriteString(" (" + string(le.Err.Code) + ")")
	}
	return b.String()
}

// buffers keeps the body buffers of finished requests for the next:
// a write request of 5,000 lines is about 300 KB.
var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuffer bounds the buffers kept in buffers: the rare body
// near MaxBytes is left to the GC.
const maxPooledBuffer = 4 << 20

func getBuffer() *bytes.Buffer { return buffers.Get().(*bytes.Buffer) }

func putBuffer(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBuffer {
		b.Reset()
		buffers.Put(b)
	}
}

// gzipReaders keeps gzip readers (their inflate state is tens of KB)
// for the next gzipped request.
var gzipReaders sync.Pool

// readBody reads the body into a buffer of the pool, gunzipping it
// when Content-Encoding says gzip, with MaxBytes enforced on both the
// raw and the inflated size. The caller puts the buffer back.
func (w *writer) readBody(req *http.Request) (*bytes.Buffer, error) {
	limit := w.cfg.MaxBytes
	tooLarge := func(what string) error {
		return influxErr(http.StatusRequestEntityTooLarge, "request too large",
			"%s is larger than %d bytes; split the batch", what, limit)
	}
	if req.ContentLength > limit {
		return nil, tooLarge("body")
	}
	raw := getBuffer()
	if req.ContentLength > 0 {
		raw.Grow(int(req.ContentLength) + 1)
	}
	_, err := raw.ReadFrom(io.LimitReader(req.Body, limit+1))
	if err != nil {
		putBuffer(raw)
		return nil, influxErr(http.StatusBadRequest, "invalid", "body: %s", err.Error())
	}
	if int64(raw.Len()) > limit {
		putBuffer(raw)
		return nil, tooLarge("body")
	}
	switch enc := strings.ToLower(strings.TrimSpace(req.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		return raw, nil
	case "gzip":
	default:
		putBuffer(raw)
		return nil, influxErr(http.StatusUnsupportedMediaType, "invalid",
			"Content-Encoding %s: want gzip or none", strconv.Quote(enc))
	}
	defer putBuffer(raw)
	zr, _ := gzipReaders.Get().(*gzip.Reader)
	if zr == nil {
		zr, err = gzip.NewReader(bytes.NewReader(raw.Bytes()))
	} else {
		err = zr.Reset(bytes.NewReader(raw.Bytes()))
	}
	if err != nil {
		return nil, influxErr(http.StatusBadRequest, "invalid", "body: not gzip: %s", err.Error())
	}
	defer gzipReaders.Put(zr)
	body := getBuffer()
	_, err = body.ReadFrom(io.LimitReader(zr, limit+1))
	if err != nil {
		putBuffer(body)
		return nil, influxErr(http.StatusBadRequest, "invalid", "body: gzip: %s", err.Error())
	}
	if int64(body.Len()) > limit {
		putBuffer(body)
		return nil, tooLarge("gunzipped body")
	}
	return body, nil
}

// query serves POST /query: CREATE DATABASE statements succeed (there
// is nothing to create), so InfluxDB 1.x clients such as Telegraf's
// influxdb output start cleanly. Anything else is refused.
func (w *writer) query(c echo.Context) error {
	q := c.QueryParam("q")
	if q == "" {
		q = c.FormValue("q")
	}
	var n int
	for stmt := range strings.SplitSeq(q, ";") {
		stmt = strings.TrimSpace(stmt)
		if stmt == "" {
			continue
		}
		f := strings.Fields(stmt)
		if len(f) < 3 || !strings.EqualFold(f[0], "CREATE") || !strings.EqualFold(f[1], "DATABASE") {
			return c.JSON(http.StatusBadRequest, map[string]string{
				"error": fmt.Sprintf("statement %d: only CREATE DATABASE is supported (readings are queried at /v1)", n),
			})
		}
		n++
	}
	if n == 0 {
		return c.JSON(http.StatusBadRequest, map[string]string{"error": "q: missing a CREATE DATABASE statement"})
	}
	results := make([]map[string]int, n)
	for i := range results {
		results[i] = map[string]int{"statement_id": i}
	}
	return c.JSON(http.StatusOK, map[string]any{"results": results})
}
