package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/semaphore"

	"github.com/telemetryd/telemetryd/buckets"
)

// Query responses within a memory budget. A reading list is held in
// memory (the page the store returned) and encoded in chunks of
// streamChunk bytes that are written as they fill, so a response never
// needs its whole encoding in memory. Before it queries, a request
// reserves readingBytes per reading it may return from a budget of
// response bytes in flight (Config.ResponseBudget); when the budget is
// spent it is answered 503 with Retry-After at once, and memory never
// grows past the budget. The reservation is trimmed to the readings the
// page holds and released when the response is written, or when the
// client is cut off: each chunk must be taken by the client within
// StallTimeout, else the connection is closed.
const (
	// DefaultResponseBudget is the default Config.ResponseBudget.
	DefaultResponseBudget = 64 << 20
	// DefaultStallTimeout is the default Config.StallTimeout.
	DefaultStallTimeout = 10 * time.Second
	// streamChunk is the size of the chunks a large response is
	// written in; a smaller response is written at once with its
	// Content-Length.
	streamChunk = 64 << 10
	// readingBytes is what one reading of a page is reckoned to take in
	// flight: its decoded form plus its share of the encoding.
	readingBytes = 256
	// budgetRetryAfter is the Retry-After of a request refused for the
	// budget, in seconds.
	budgetRetryAfter = 1
	// promQueriesAtOnce is how many PromQL queries the budget holds at
	// once: each reserves this fraction of it, and its engine may hold
	// PromQLMaxSamples samples of promSampleBytes each.
	promQueriesAtOnce = 8
	// promSampleBytes is a sample as the engine holds it (a timestamp
	// and a float64).
	promSampleBytes = 16
)

// PromQLMaxSamples is the engine's limit on samples one query holds at
// once (promapi.Config.MaxSamples) that keeps promQueriesAtOnce
// queries within a response budget of budget bytes (0: the default).
func PromQLMaxSamples(budget int64) int {
	return int(cmp.Or(budget, DefaultResponseBudget) / promQueriesAtOnce / promSampleBytes)
}

// responseMetrics count what the budget and the stall timeout did.
type responseMetrics struct {
	refused metric.Int64Counter // telemetry.http.responses.refused
	cutOff  metric.Int64Counter // telemetry.http.responses.cut_off
}

func newResponseMetrics(mp metric.MeterProvider) (responseMetrics, error) {
	m := mp.Meter(instrumentationName)
	var rm responseMetrics
	var err error
	if rm.refused, err = m.Int64Counter("telemetry.http.responses.refused",
		metric.WithDescription("Query requests answered 503 because the budget of response bytes in flight was spent."),
		metric.WithUnit("{request}")); err != nil {
		return rm, fmt.Errorf("create telemetry.http.responses.refused: %w", err)
	}
	if rm.cutOff, err = m.Int64Counter("telemetry.http.responses.cut_off",
		metric.WithDescription("Streamed responses abandoned because the client did not read them within the stall timeout."),
		metric.WithUnit("{response}")); err != nil {
		return rm, fmt.Errorf("create telemetry.http.responses.cut_off: %w", err)
	}
	// Both start at 0 on /metrics, so alerts on them see a series.
	rm.refused.Add(context.Background(), 0)
	rm.cutOff.Add(context.Background(), 0)
	return rm, nil
}

// responseBudget bounds the response bytes in flight.
type responseBudget struct {
	sem  *semaphore.Weighted
	size int64
}

func newResponseBudget(size int64) *responseBudget {
	return &responseBudget{sem: semaphore.NewWeighted(size), size: size}
}

// reservation is a part of the budget one request holds.
type reservation struct {
	b *responseBudget
	n int64
}

// reserve takes room for up to n readings, or answers 503 with
// Retry-After when the budget cannot spare it now.
func (s *Server) reserve(c echo.Context, n int) (*reservation, error) {
	return s.reserveBytes(c, max(int64(n), 1)*readingBytes)
}

// reserveBytes takes want bytes of the budget (at most all of it), or
// answers 503 with Retry-After when the budget cannot spare them now.
func (s *Server) reserveBytes(c echo.Context, want int64) (*reservation, error) {
	want = min(want, s.budget.size)
	if !s.budget.sem.TryAcquire(want) {
		s.respM.refused.Add(c.Request().Context(), 1)
		c.Response().Header().Set("Retry-After", strconv.Itoa(budgetRetryAfter))
		return nil, &apiError{http.StatusServiceUnavailable, codeUnavailable,
			"query responses: the memory budget for responses in flight is spent (" +
				strconv.FormatInt(s.budget.size>>20, 10) + " MiB); retry later"}
	}
	return &reservation{b: s.budget, n: want}, nil
}

// trim gives back what a page of n readings does not need.
func (r *reservation) trim(n int) {
	keep := min(max(int64(n), 1)*readingBytes, r.n)
	if keep < r.n {
		r.b.sem.Release(r.n - keep)
		r.n = keep
	}
}

// release gives everything back; it may be called more than once.
func (r *reservation) release() {
	if r.n > 0 {
		r.b.sem.Release(r.n)
		r.n = 0
	}
}

// sendReadingList writes a reading list: at once with its
// Content-Length when it fits one chunk, else streamed in chunks, each
// of which the client must take within the stall timeout.
func (s *Server) sendReadingList(c echo.Context, dev buckets.DeviceID, rs []buckets.Reading, proj []string, next string) error {
	buf := getBuf()
	defer putBuf(buf)
	b := append((*buf)[:0], `{"device":`...)
	b = appendString(b, string(dev))
	b = append(b, `,"readings":[`...)
	var w *chunkWriter
	var enc listEncoder
	for i := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = enc.appendReading(b, &rs[i], proj)
		if len(b) >= streamChunk {
			if w == nil {
				w = s.startStream(c)
			}
			if err := w.write(b); err != nil {
				*buf = b[:0]
				return nil // the client is gone or was cut off; nothing more to say
			}
			b = b[:0]
		}
	}
	b = append(b, ']')
	b = appendNext(b, next)
	b = withWarnings(c.Request().Context(), append(b, "}\n"...))
	*buf = b
	if w == nil {
		writeJSON(c, http.StatusOK, b)
		return nil
	}
	_ = w.write(b)
	return nil
}

// chunkWriter writes a streamed response, each write under a deadline.
type chunkWriter struct {
	c     echo.Context
	rc    *http.ResponseController
	stall time.Duration
	head  bool
	s     *Server
}

// startStream sends the headers of a streamed 200 response.
func (s *Server) startStream(c echo.Context) *chunkWriter {
	res := c.Response()
	res.Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	res.WriteHeader(http.StatusOK)
	return &chunkWriter{c: c, rc: http.NewResponseController(res), stall: s.stallTimeout,
		head: c.Request().Method == http.MethodHead, s: s}
}

// errCutOff reports a client that did not take a chunk in time.
var errCutOff = errors.New("client did not read the response in time")

func (w *chunkWriter) write(b []byte) error {
	if w.head {
		return nil
	}
	if err := w.rc.SetWriteDeadline(time.Now().Add(w.stall)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	if _, err := w.c.Response().Write(b); err != nil {
		ctx := context.WithoutCancel(w.c.Request().Context())
		w.s.respM.cutOff.Add(ctx, 1)
		w.s.log.DebugContext(ctx, "response cut off", "remote", w.c.Request().RemoteAddr, "err", err)
		return errCutOff
	}
	return nil
}
