package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/semaphore"

	"github.com/telemetryd/telemetryd/api/auth"
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

// PromQLResultBytes bounds the range query answers the PromQL API keeps
// for a dashboard's next refresh: a fifth of the response budget,
// beside it.
func PromQLResultBytes(budget int64) int64 { return cmp.Or(budget, DefaultResponseBudget) / 5 }

// responseMetrics count what the budget and the stall timeout did.
type responseMetrics struct {
	refused       metric.Int64Counter // telemetry.http.responses.refused
	cutOff        metric.Int64Counter // telemetry.http.responses.cut_off
	writesRefused metric.Int64Counter // telemetry.http.writes.refused
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
	if rm.writesRefused, err = m.Int64Counter("telemetry.http.writes.refused",
		metric.WithDescription("Write requests answered 503 because the budget of write bodies in flight was spent."),
		metric.WithUnit("{request}")); err != nil {
		return rm, fmt.Errorf("create telemetry.http.writes.refused: %w", err)
	}
	// They start at 0 on /metrics, so alerts on them see a series.
	rm.refused.Add(context.Background(), 0)
	rm.cutOff.Add(context.Background(), 0)
	rm.writesRefused.Add(context.Background(), 0)
	return rm, nil
}

// byteBudget bounds bytes in flight: the response bytes of queries, or
// the write bodies being read and mapped. It is a weighted semaphore
// that is only ever tried, never waited on: a request that does not fit
// is refused at once.
type byteBudget struct {
	sem  *semaphore.Weighted
	size int64
}

func newByteBudget(size int64) *byteBudget {
	return &byteBudget{sem: semaphore.NewWeighted(size), size: size}
}

// quota counts what each client holds of a shared limit (bytes of the
// response budget, or queries in flight) and refuses a client past its
// share (Config.ClientShares), so the rest stays for every other client
// however heavy its queries.
type quota struct {
	mu    sync.Mutex
	share int64
	used  map[string]int64
}

func newQuota(share int64) *quota {
	return &quota{share: max(share, 1), used: make(map[string]int64)}
}

// take adds n to what client holds, unless that would pass its share.
func (q *quota) take(client string, n int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.used[client]+n > q.share {
		return false
	}
	q.used[client] += n
	return true
}

// give returns n of what client holds.
func (q *quota) give(client string, n int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.used[client] -= n; q.used[client] <= 0 {
		delete(q.used, client)
	}
}

// clientKey names the client a request is charged to: its token when
// it carries one, else the TCP peer's address.
func clientKey(c echo.Context) string {
	if p := auth.FromContext(c.Request().Context()); p != nil {
		return "t:" + p.Name
	}
	return "a:" + clientAddr(c.Request().RemoteAddr)
}

// reservation is a part of a budget one request holds, and of its
// client's share when the budget is divided among clients.
type reservation struct {
	b      *byteBudget
	q      *quota // nil: not divided
	client string
	n      int64
}

// reserve takes room for up to n readings, or refuses the request (see
// reserveBytes).
func (s *Server) reserve(c echo.Context, n int) (*reservation, error) {
	return s.reserveBytes(c, max(int64(n), 1)*readingBytes)
}

// reserveBytes takes want bytes of the response budget (at most the
// client's share of it). A client whose other queries hold its share
// is answered 429 resource_exhausted, and every request 503 unavailable
// when the budget is spent; both with Retry-After and at once.
func (s *Server) reserveBytes(c echo.Context, want int64) (*reservation, error) {
	want = min(want, s.budget.size)
	var client string
	if s.shares != nil {
		want = min(want, s.shares.share)
		client = clientKey(c)
		if !s.shares.take(client, want) {
			s.respM.refused.Add(c.Request().Context(), 1)
			c.Response().Header().Set("Retry-After", strconv.Itoa(budgetRetryAfter))
			return nil, &apiError{http.StatusTooManyRequests, codeResourceExhausted,
				"query responses: this client's share of the memory budget for responses in flight (" +
					mib(s.shares.share) + " of " + mib(s.budget.size) + ") is held by its other queries; retry later"}
		}
	}
	if !s.budget.sem.TryAcquire(want) {
		if s.shares != nil {
			s.shares.give(client, want)
		}
		s.respM.refused.Add(c.Request().Context(), 1)
		c.Response().Header().Set("Retry-After", strconv.Itoa(budgetRetryAfter))
		return nil, &apiError{http.StatusServiceUnavailable, codeUnavailable,
			"query responses: the memory budget for responses in flight is spent (" + mib(s.budget.size) + "); retry later"}
	}
	return &reservation{b: s.budget, q: s.shares, client: client, n: want}, nil
}

// mib writes n bytes as whole MiB ("64 MiB"), or KiB below one MiB.
func mib(n int64) string {
	if n < 1<<20 {
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n>>20, 10) + " MiB"
}

// growTo makes the reservation total bytes, taking the difference from
// the budget; false when the budget cannot spare it now.
func (r *reservation) growTo(total int64) bool {
	d := total - r.n
	if d <= 0 {
		return true
	}
	if r.q != nil && !r.q.take(r.client, d) {
		return false
	}
	if !r.b.sem.TryAcquire(d) {
		if r.q != nil {
			r.q.give(r.client, d)
		}
		return false
	}
	r.n = total
	return true
}

// shrinkTo gives back all but total bytes.
func (r *reservation) shrinkTo(total int64) {
	if d := r.n - max(total, 0); d > 0 {
		r.b.sem.Release(d)
		if r.q != nil {
			r.q.give(r.client, d)
		}
		r.n -= d
	}
}

// trim gives back what a page of n readings does not need.
func (r *reservation) trim(n int) {
	r.shrinkTo(min(max(int64(n), 1)*readingBytes, r.n))
}

// release gives everything back; it may be called more than once.
func (r *reservation) release() { r.shrinkTo(0) }

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
