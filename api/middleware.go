package api

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// instrumentationName names the tracer and meter of this package.
const instrumentationName = "github.com/telemetryd/telemetryd/api"

// observer holds the tracer and the request duration histogram.
type observer struct {
	tracer     trace.Tracer
	duration   metric.Float64Histogram
	propagator propagation.TextMapPropagator
}

func newObserver(tp trace.TracerProvider, mp metric.MeterProvider) (observer, error) {
	meter := mp.Meter(instrumentationName)
	d, err := meter.Float64Histogram("http.server.request.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of HTTP server requests."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	if err != nil {
		return observer{}, fmt.Errorf("create http.server.request.duration: %w", err)
	}
	return observer{tracer: tp.Tracer(instrumentationName), duration: d, propagator: propagation.TraceContext{}}, nil
}

// knownMethods are recorded as they are; any other method becomes
// "_OTHER", so clients cannot create attribute values.
var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
	http.MethodConnect: true, http.MethodTrace: true,
}

// observe is the outermost middleware. It continues the caller's W3C
// trace context, runs the request in a server span named
// "<METHOD> <route>", renders any error right away (so the final status
// is known) and records http.server.request.duration by method, route
// template and status.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		req := c.Request()
		method := req.Method
		if !knownMethods[method] {
			method = "_OTHER"
		}
		route := s.routeOf(c)
		name := method
		if route != "" {
			name += " " + route
		}
		attrs := make([]attribute.KeyValue, 0, 3)
		attrs = append(attrs, semconv.HTTPRequestMethodKey.String(method))
		if route != "" {
			attrs = append(attrs, semconv.HTTPRoute(route))
		}
		ctx := s.obs.propagator.Extract(req.Context(), propagation.HeaderCarrier(req.Header))
		ctx, span := s.obs.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attrs...), trace.WithAttributes(semconv.URLPath(req.URL.Path)))
		defer span.End()
		c.SetRequest(req.WithContext(ctx))

		if err := next(c); err != nil {
			c.Error(err)
		}
		status := c.Response().Status
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
		attrs = append(attrs, semconv.HTTPResponseStatusCode(status))
		s.obs.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrs...))
		return nil
	}
}

// recoverPanic turns a panic in a handler into a 500 (logged once, with
// its stack, by the error handler). http.ErrAbortHandler keeps its
// meaning of aborting the response.
func (s *Server) recoverPanic(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				err = &panicError{value: v, stack: debug.Stack()}
			}
		}()
		return next(c)
	}
}

// limitBody rejects request bodies over MaxBodyBytes with 413: at once
// when Content-Length says so, else when a handler reads past it.
func limitBody(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if writePaths[c.Path()] {
			return next(c) // limited by WriteConfig.MaxBytes
		}
		req := c.Request()
		if req.ContentLength > MaxBodyBytes {
			return tooLarge()
		}
		if req.Body != nil && req.Body != http.NoBody {
			req.Body = http.MaxBytesReader(c.Response(), req.Body, MaxBodyBytes)
		}
		return next(c)
	}
}

// limitInFlight admits at most MaxInFlight query requests at once, and
// at most a share of them (Config.ClientShares) from one client, and
// answers the rest with 429 and Retry-After, rather than queueing them.
// Node-to-node calls of a cluster count only against MaxInFlight: they
// carry the queries of many clients.
func (s *Server) limitInFlight(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.perClient != nil && !strings.HasPrefix(c.Path(), internalPrefix) {
			client := clientKey(c)
			if !s.perClient.take(client, 1) {
				c.Response().Header().Set("Retry-After", "1")
				return &apiError{http.StatusTooManyRequests, codeResourceExhausted,
					"request: this client has " + strconv.FormatInt(s.perClient.share, 10) +
						" queries in flight, its share of " + strconv.Itoa(s.maxInFlight) + "; retry later"}
			}
			defer s.perClient.give(client, 1)
		}
		select {
		case s.inFlight <- struct{}{}:
			defer func() { <-s.inFlight }()
			return next(c)
		default:
			c.Response().Header().Set("Retry-After", "1")
			return &apiError{http.StatusTooManyRequests, codeResourceExhausted,
				"request: more than " + strconv.Itoa(s.maxInFlight) + " queries in flight; retry later"}
		}
	}
}

// withTimeout gives a query request a deadline of QueryTimeout.
func (s *Server) withTimeout(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx, cancel := context.WithTimeout(c.Request().Context(), s.queryTimeout)
		defer cancel()
		c.SetRequest(c.Request().WithContext(ctx))
		return next(c)
	}
}

// requireAdmin guards admin endpoints. With an auth file, authenticate
// has required the admin scope already. Without one only loopback
// clients are admitted (403 otherwise); the client address is the TCP
// peer, never a forwarding header, which a remote client could forge.
func (s *Server) requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.tokens == nil && !isLoopback(c.Request().RemoteAddr) {
			return &apiError{http.StatusForbidden, codePermissionDenied,
				"authorization: without an auth file, admin endpoints accept only loopback clients"}
		}
		return next(c)
	}
}

// isLoopback reports whether a RemoteAddr ("host:port") is a loopback
// address.
func isLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
