package api

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
)

// Publisher stores the messages Map made of a body: the devices'
// readings (ingest.Publisher over JetStream: one message per partition
// in the form of package ingest/lpwire), each dead letter on the
// rejected subject of its device. Publish returns once every message is
// acknowledged by its stream, or with the first error; publishing the
// same messages twice stores their readings once.
type Publisher interface {
	Publish(ctx context.Context, msgs []linemsg.Message) error
}

// LineMapper maps a body of line protocol to the messages of its
// devices' readings and the dead letters of its rejected lines
// (ingest/lineproto.Mapper, whose package comment says how each line
// maps). Map names every rejected line; MapAll reports false, holding
// nothing, as soon as a line is bad.
type LineMapper interface {
	Map(body []byte, opts linemsg.Options) linemsg.Result
	MapAll(body []byte, opts linemsg.Options) (linemsg.Result, bool)
}

// DefaultDeviceTags are WriteConfig.DeviceTags' default.
func DefaultDeviceTags() []string { return []string{"device", "host"} }

// Defaults of WriteConfig.
const (
	DefaultMaxWriteBytes = 16 << 20
	// DefaultPublishTimeout is WriteConfig.PublishTimeout's default.
	DefaultPublishTimeout = 30 * time.Second
	// partGrace is how long a part (or chunk) of a body whose
	// publishing started before the publish timeout may still take.
	partGrace = 15 * time.Second
	// maxNamedLines is how many rejected lines a 400 names.
	maxNamedLines = 3
)

// WriteConfig configures the InfluxDB line protocol write endpoints
// (ingest/README.md): POST /api/v2/write, POST /write and POST /query.
type WriteConfig struct {
	// Publisher stores the mapped messages; nil makes the write
	// endpoints answer 501.
	Publisher Publisher
	// Mapper maps bodies to messages; nil makes the write endpoints
	// answer 501.
	Mapper LineMapper
	// DeviceTags: the first of these tags present on a line names its
	// device. Default device, host.
	DeviceTags []string
	// Tags says what a line's other tags become: attributes of its
	// device (the zero value, linemsg.TagsAsAttributes) or string
	// values (linemsg.TagsAsValues).
	Tags linemsg.TagMode
	// NameSeparator joins a line's measurement and field into a value
	// name: '_' (climate_temp) or '.' (climate.temp). Zero:
	// linemsg.DefaultNameSeparator ('_').
	NameSeparator byte
	// MaxBytes bounds a body before and after gunzip (413 beyond).
	// Default DefaultMaxWriteBytes.
	MaxBytes int64
	// MaxMessageBytes bounds one published message (the NATS server's
	// max payload). Default linemsg.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Window is the accepted time window, the ingester's; each zero
	// half takes its buckets default.
	Window buckets.Window
	// PublishTimeout: no part of a body starts publishing after it (a
	// part under way gets partGrace more); the answer then names the
	// lines accepted (partial.go). Default DefaultPublishTimeout.
	PublishTimeout time.Duration
	// Budget bounds the bytes of write bodies in flight: bodies as
	// received, gunzipped, and the lines being mapped to messages. A
	// write that does not fit is answered 503 with Retry-After, before
	// its body is read or as soon as its gunzipped size passes what is
	// left. Default DefaultWriteBudget, and never below
	// MinWriteBudget(MaxBytes), so the largest body fits.
	Budget int64
}

// Write bodies within a memory budget. Every buffer a write request
// holds is paid for from WriteConfig.Budget before it is allocated: the
// body as received (its Content-Length, or 64 KiB steps as it arrives),
// the gunzipped body as it is inflated (so a small gzip body that
// inflates to MaxBytes is charged MaxBytes), and room to map lines to
// messages. When the budget can pay wholeMapFactor times a part of
// wholePart bytes and still hold the largest body (MinWriteBudget)
// besides, the lines are first mapped a part at a time with
// LineMapper.MapAll, which gives up at the first bad line and holds no
// errors (publishParts); otherwise, and for a body with a bad line,
// they are mapped and published mapChunk bytes at a time, so a body of
// lines that are all rejected holds the errors of one chunk, not of the
// whole body (publishChunks).
const (
	// DefaultWriteBudget is the default WriteConfig.Budget.
	DefaultWriteBudget = 64 << 20
	// mapChunk is how many bytes of lines are mapped at once (a chunk
	// ends at the first line end past it).
	mapChunk = 256 << 10
	// mapBytes is what mapping one chunk is reckoned to hold: a
	// rejected line holds about 13 times its text in its error and its
	// dead letter.
	mapBytes = 16 * mapChunk
	// wholePart is how many bytes of lines are mapped at once when
	// every line is good (LineMapper.MapAll; a part ends at the first
	// line end past it): a 10,000-line request of TSBS IoT lines (2.4
	// MB) is one part.
	wholePart = 4 << 20
	// wholeMapFactor: mapping a part of good lines holds up to about
	// this many times its size (6.5 times on TSBS IoT lines: the values
	// of its readings, their attributes and the messages).
	wholeMapFactor = 8
	// readStep is the first buffer of a body of unknown length and the
	// least a buffer grows by.
	readStep = 64 << 10
)

// MinWriteBudget is the smallest write budget that holds the largest
// body, maxBytes received and maxBytes gunzipped, while it is mapped.
func MinWriteBudget(maxBytes int64) int64 { return 2*(maxBytes+1) + mapBytes }

// writer serves the write endpoints.
type writer struct {
	cfg     WriteConfig
	now     func() time.Time
	budget  *byteBudget
	refused metric.Int64Counter // telemetry.http.writes.refused
}

// writePaths are the routes that enforce their own body limit
// (WriteConfig.MaxBytes) instead of MaxBodyBytes.
var writePaths = map[string]bool{"/api/v2/write": true, "/write": true}

func newWriter(cfg *WriteConfig, now func() time.Time) *writer {
	w := &writer{now: now}
	if cfg != nil {
		w.cfg = *cfg
	}
	w.cfg.MaxBytes = cmp.Or(w.cfg.MaxBytes, DefaultMaxWriteBytes)
	w.cfg.PublishTimeout = cmp.Or(w.cfg.PublishTimeout, DefaultPublishTimeout)
	w.cfg.Budget = max(cmp.Or(w.cfg.Budget, DefaultWriteBudget), MinWriteBudget(w.cfg.MaxBytes))
	w.budget = newByteBudget(w.cfg.Budget)
	w.cfg.MaxMessageBytes = cmp.Or(w.cfg.MaxMessageBytes, linemsg.DefaultMaxMessageBytes)
	w.cfg.Window.Retention = cmp.Or(w.cfg.Window.Retention, buckets.DefaultRetention)
	w.cfg.Window.MaxFutureSkew = cmp.Or(w.cfg.Window.MaxFutureSkew, buckets.DefaultMaxFutureSkew)
	if len(w.cfg.DeviceTags) == 0 {
		w.cfg.DeviceTags = DefaultDeviceTags()
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
	// AcceptedLines and AcceptedReadings, on a write cut short: the
	// body's first AcceptedLines lines were accepted (partial.go).
	AcceptedLines    *int `json:"acceptedLines,omitempty"`
	AcceptedReadings *int `json:"acceptedReadings,omitempty"`
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
	if w.cfg.Publisher == nil || w.cfg.Mapper == nil {
		return influxErr(http.StatusNotImplemented, "not implemented", "writes are not enabled on this instance")
	}
	req := c.Request()
	precision, err := linemsg.ParsePrecision(req.URL.Query().Get("precision"), v1)
	if err != nil {
		return influxErr(http.StatusBadRequest, "invalid", "%s", err.Error())
	}
	res := &reservation{b: w.budget}
	defer res.release()
	body, err := w.readBody(req, res)
	if errors.Is(err, errWriteBudget) {
		w.refused.Add(req.Context(), 1)
		return influxErr(http.StatusServiceUnavailable, "unavailable",
			"write bodies: the memory budget for write bodies in flight is spent (%s); retry later", mib(w.budget.size))
	}
	if err != nil {
		return err
	}
	// Nothing Map returns refers to the body: its buffer goes back to
	// the pool once the lines are mapped.
	defer putBytes(body)
	if !res.growTo(int64(cap(body)) + mapBytes) {
		w.refused.Add(req.Context(), 1)
		return influxErr(http.StatusServiceUnavailable, "unavailable",
			"write bodies: the memory budget for write bodies in flight is spent (%s); retry later", mib(w.budget.size))
	}
	opts := linemsg.Options{
		DeviceTags:      w.cfg.DeviceTags,
		Tags:            w.cfg.Tags,
		NameSeparator:   w.cfg.NameSeparator,
		Precision:       precision,
		Now:             w.now(),
		Window:          w.cfg.Window,
		MaxMessageBytes: w.cfg.MaxMessageBytes,
		Allow:           func(dev string) bool { return auth.Visible(req.Context(), dev) },
	}
	ctx, cancel := context.WithTimeout(req.Context(), w.cfg.PublishTimeout+partGrace)
	defer cancel()
	sum := writeSummary{partialState: partialState{startBy: time.Now().Add(w.cfg.PublishTimeout)}}
	done, err := w.publishParts(ctx, body, opts, res, &sum)
	if err != nil {
		return partialAnswer(err, body, &sum, w.cfg.PublishTimeout)
	}
	if !done {
		if err := w.publishChunks(ctx, body, opts, &sum); err != nil {
			return partialAnswer(err, body, &sum, w.cfg.PublishTimeout)
		}
	}
	if sum.rejected > 0 {
		if sum.readings == 0 && sum.allDenied {
			return influxErr(http.StatusForbidden, "forbidden", "%s", sum.partialWrite())
		}
		return influxErr(http.StatusBadRequest, "invalid", "%s", sum.partialWrite())
	}
	return nil
}

// publishParts maps and publishes body in parts of about wholePart
// bytes with LineMapper.MapAll, so that each device's lines of a part
// are one payload (or a few large ones), not one per mapChunk of
// lines: a device's readings then cost the ingester and the store a
// decode and a block per part. It reports false,
// having published nothing, when the budget cannot pay for mapping a
// part (wholeMapFactor times its size) and false too when a line is
// bad: then the caller maps the whole body with publishChunks, whose
// dead letters name every bad line and depend on the body alone. Parts
// published before the bad one are published again then, which stores
// nothing twice: readings merge by device and time. res holds the body
// and mapBytes when it is called, and again when it returns. A body of
// one chunk is left to publishChunks, which maps it the same way.
func (w *writer) publishParts(ctx context.Context, body []byte, opts linemsg.Options, res *reservation, sum *writeSummary) (bool, error) {
	if len(body) <= mapChunk {
		return false, nil // one chunk either way
	}
	largest := 0
	for _, part := range chunks(body, wholePart) {
		largest = max(largest, len(part.lines))
	}
	// Mapping whole spares work; it is not needed. So it takes budget
	// only while the largest body could still come in besides: it never
	// turns away a write that mapping in chunks would have let in.
	held := res.n
	want := max(int64(cap(body))+wholeMapFactor*int64(largest), held)
	if !res.growTo(want + MinWriteBudget(w.cfg.MaxBytes)) {
		return false, nil
	}
	res.shrinkTo(want)
	defer res.shrinkTo(held)
	parts := writeSummary{partialState: partialState{startBy: sum.startBy}}
	for i, part := range chunks(body, wholePart) {
		if err := parts.mayStart(ctx, part.offset); err != nil {
			*sum = parts
			return true, err
		}
		r, ok := w.cfg.Mapper.MapAll(part.lines, opts)
		if !ok {
			return false, nil
		}
		parts.add(&r, part.offset, i)
		if err := w.cfg.Publisher.Publish(ctx, r.Messages); err != nil {
			*sum = parts
			return true, parts.failed(part, err)
		}
		parts.accepted(part, r.Readings)
	}
	*sum = parts
	return true, nil
}

// publishChunks maps and publishes body mapChunk bytes at a time with
// LineMapper.Map, so that a body of rejected lines holds the errors of
// one chunk at a time.
func (w *writer) publishChunks(ctx context.Context, body []byte, opts linemsg.Options, sum *writeSummary) error {
	for i, chunk := range chunks(body, mapChunk) {
		if err := sum.mayStart(ctx, chunk.offset); err != nil {
			return err
		}
		r := w.cfg.Mapper.Map(chunk.lines, opts)
		sum.add(&r, chunk.offset, i)
		msgs := append(r.Messages, r.DeadLetters...)
		if err := w.cfg.Publisher.Publish(ctx, msgs); err != nil {
			return sum.failed(chunk, err)
		}
		sum.accepted(chunk, r.Readings)
	}
	return nil
}

// bodyChunk is a run of whole lines of a body; offset counts the lines
// before it.
type bodyChunk struct {
	lines  []byte
	offset int
}

// chunks cuts body into runs of whole lines of at least size bytes
// (the last may be shorter), each ending at a line end.
func chunks(body []byte, size int) func(yield func(int, bodyChunk) bool) {
	return func(yield func(int, bodyChunk) bool) {
		offset := 0
		for i := 0; len(body) > 0; i++ {
			n := len(body)
			if n > size {
				if j := bytes.IndexByte(body[size:], '\n'); j >= 0 {
					n = size + j + 1
				}
			}
			if !yield(i, bodyChunk{lines: body[:n], offset: offset}) {
				return
			}
			offset += bytes.Count(body[:n], []byte{'\n'})
			body = body[n:]
		}
	}
}

// writeSummary is what the chunks of a body came to: counts, the first
// maxNamedLines rejected lines, and whether every rejection was a
// device the token may not write.
type writeSummary struct {
	lines, readings, rejected int
	named                     []linemsg.LineError
	allDenied                 bool
	partialState              // what was accepted so far (partial.go)
}

// add counts the result of the chunk number i whose lines follow
// offset others, renumbering its rejected lines (and the dead letters
// of the chunks after the first, whose IDs also get the chunk number:
// the same bad line at the same place in two chunks is two letters).
func (s *writeSummary) add(r *linemsg.Result, offset, i int) {
	if s.rejected == 0 {
		s.allDenied = true
	}
	s.lines += r.Lines
	s.readings += r.Readings
	s.rejected += len(r.Rejected)
	d := 0 // the dead letters of r, one per rejection but the denied ones
	for _, le := range r.Rejected {
		local := le.Line
		le.Line += offset
		if len(s.named) < maxNamedLines+1 {
			s.named = append(s.named, le)
		}
		if le.Err.Code != linemsg.CodeDeviceNotAllowed {
			s.allDenied = false
			if i > 0 && d < len(r.DeadLetters) {
				dl := &r.DeadLetters[d]
				dl.MsgID += "." + strconv.Itoa(i)
				if rest, ok := strings.CutPrefix(dl.Reason, "line "+strconv.Itoa(local)+": "); ok {
					dl.Reason = "line " + strconv.Itoa(le.Line) + ": " + rest
				}
			}
			d++
		}
	}
}

// partialWrite is "partial write: X of Y lines rejected; line N: ...".
func (s *writeSummary) partialWrite() string {
	var b strings.Builder
	fmt.Fprintf(&b, "partial write: %d of %d lines rejected", s.rejected, s.lines)
	for i, le := range s.named {
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

// Body buffers of finished requests are kept for the next, in a list
// per size class: a write request of 10,000 lines is about 2.4 MB, and
// requests of about the same size differ by a few bytes. A buffer is
// made with the capacity of its class (n rounded up to a quarter of the
// power of two below it: at most 25% more), so that the next body of
// about the same size finds it, and a body of unknown length grows
// through the classes, so the buffers it outgrows serve the next. The
// lists keep at most GOMAXPROCS times maxPooledBuffer bytes in all, the
// rest are left to the GC: what they keep is live at every collection,
// and stays while no write comes. (With one sync.Pool for every size, a
// body a little larger than the buffer it drew made a new one and put
// the other back, and the pool came to hold four to eight buffers for
// two requests in flight.)
var buffers struct {
	sync.Mutex
	idle  [bufferClasses][][]byte
	bytes int // capacity of the buffers in idle
}

// maxIdleBufferBytes bounds the bytes of the buffers kept.
func maxIdleBufferBytes() int { return runtime.GOMAXPROCS(0) * maxPooledBuffer }

const (
	// maxPooledBuffer bounds the buffers kept: the rare body near
	// MaxBytes is left to the GC.
	maxPooledBuffer = 4 << 20
	// minBufferClass is the capacity of the smallest class (readStep).
	minBufferClass = readStep
	// bufferClasses: minBufferClass (2^16), then four per power of
	// two up to maxPooledBuffer (2^22).
	bufferClasses = 4*(22-16) + 1
)

// bufferClass returns the capacity of n's size class and its index
// into buffers; ok is false when n is larger than maxPooledBuffer.
func bufferClass(n int) (c, i int, ok bool) {
	if n > maxPooledBuffer {
		return n, 0, false
	}
	if n <= minBufferClass {
		return minBufferClass, 0, true
	}
	e := bits.Len(uint(n-1)) - 1 // 2^e < n <= 2^(e+1)
	step := 1 << (e - 2)
	c = (n + step - 1) / step * step
	// c is 2^e times 5/4, 6/4, 7/4 or 8/4.
	return c, 4*(e-bits.Len(minBufferClass)+1) + c/step - 4, true
}

// bufferCap is the capacity of the buffer getBytes(n, limit) returns:
// n's class, or n itself when the class is larger than limit or n is
// not pooled.
func bufferCap(n, limit int) int {
	if c, _, ok := bufferClass(n); ok && c <= limit {
		return c
	}
	return n
}

// getBytes returns an empty buffer of capacity bufferCap(n, limit):
// from the list of n's class when it has one.
func getBytes(n, limit int) []byte {
	c, i, ok := bufferClass(n)
	if !ok || c > limit {
		return make([]byte, 0, n)
	}
	buffers.Lock()
	defer buffers.Unlock()
	if idle := buffers.idle[i]; len(idle) > 0 {
		b := idle[len(idle)-1]
		idle[len(idle)-1] = nil
		buffers.idle[i] = idle[:len(idle)-1]
		buffers.bytes -= cap(b)
		return b
	}
	return make([]byte, 0, c)
}

// putBytes keeps b for the next request when its capacity is a size
// class and the lists have room.
func putBytes(b []byte) {
	c, i, ok := bufferClass(cap(b))
	if !ok || c != cap(b) {
		return
	}
	buffers.Lock()
	defer buffers.Unlock()
	if buffers.bytes+cap(b) <= maxIdleBufferBytes() {
		buffers.idle[i] = append(buffers.idle[i], b[:0])
		buffers.bytes += cap(b)
	}
}

// gzipReaders keeps gzip readers (their inflate state is tens of KB)
// for the next gzipped request.
var gzipReaders sync.Pool

// errWriteBudget reports a body that does not fit what is left of the
// write budget.
var errWriteBudget = errors.New("the write budget is spent")

// readBody reads the body into a buffer that res pays for, gunzipping
// it when Content-Encoding says gzip, with MaxBytes enforced on both
// the raw and the inflated size; errWriteBudget when the budget cannot
// pay. The caller puts the buffer back (putBytes).
func (w *writer) readBody(req *http.Request, res *reservation) ([]byte, error) {
	limit := w.cfg.MaxBytes
	tooLarge := func(what string) error {
		return influxErr(http.StatusRequestEntityTooLarge, "request too large",
			"%s is larger than %d bytes; split the batch", what, limit)
	}
	if req.ContentLength > limit {
		return nil, tooLarge("body")
	}
	raw, err := readCharged(req.Body, limit, res, 0, req.ContentLength)
	if errors.Is(err, errWriteBudget) {
		return nil, err
	}
	if err != nil {
		return nil, influxErr(http.StatusBadRequest, "invalid", "body: %s", err.Error())
	}
	if int64(len(raw)) > limit {
		putBytes(raw)
		return nil, tooLarge("body")
	}
	switch enc := strings.ToLower(strings.TrimSpace(req.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		return raw, nil
	case "gzip":
	default:
		putBytes(raw)
		return nil, influxErr(http.StatusUnsupportedMediaType, "invalid",
			"Content-Encoding %s: want gzip or none", strconv.Quote(enc))
	}
	defer func() {
		putBytes(raw)
		res.shrinkTo(res.n - int64(cap(raw)))
	}()
	zr, _ := gzipReaders.Get().(*gzip.Reader)
	if zr == nil {
		zr, err = gzip.NewReader(bytes.NewReader(raw))
	} else {
		err = zr.Reset(bytes.NewReader(raw))
	}
	if err != nil {
		return nil, influxErr(http.StatusBadRequest, "invalid", "body: not gzip: %s", err.Error())
	}
	defer gzipReaders.Put(zr)
	body, err := readCharged(zr, limit, res, int64(cap(raw)), -1)
	if errors.Is(err, errWriteBudget) {
		return nil, err
	}
	if err != nil {
		return nil, influxErr(http.StatusBadRequest, "invalid", "body: gzip: %s", err.Error())
	}
	if int64(len(body)) > limit {
		putBytes(body)
		return nil, tooLarge("gunzipped body")
	}
	return body, nil
}

// readCharged reads r to its end, at most limit+1 bytes, into a buffer
// that res pays for before each allocation (held: what res pays for
// besides). size is the length r is expected to have, or -1.
func readCharged(r io.Reader, limit int64, res *reservation, held, size int64) ([]byte, error) {
	r = io.LimitReader(r, limit+1)
	first := int64(readStep)
	if size >= 0 {
		first = size + 1 // room to see the end
	}
	n := int(min(first, limit+1))
	if !res.growTo(held + int64(bufferCap(n, int(limit+1)))) {
		return nil, errWriteBudget
	}
	b := getBytes(n, int(limit+1))
	for {
		if len(b) == cap(b) {
			if int64(len(b)) > limit {
				return b, nil
			}
			n := int(min(max(2*int64(cap(b)), readStep), limit+1))
			if !res.growTo(held + int64(bufferCap(n, int(limit+1)))) {
				putBytes(b)
				return nil, errWriteBudget
			}
			nb := getBytes(n, int(limit+1))[:len(b)]
			copy(nb, b)
			putBytes(b)
			b = nb
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			putBytes(b)
			return nil, err
		}
	}
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
