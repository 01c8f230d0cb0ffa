package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/telemetryd/telemetryd/api/promapi"
	"github.com/telemetryd/telemetryd/buckets"
)

// Error codes in the "code" field of an error response.
const (
	codeInvalidArgument   = "invalid_argument"
	codeUnauthenticated   = "unauthenticated"
	codePermissionDenied  = "permission_denied"
	codeNotFound          = "not_found"
	codeMethodNotAllowed  = "method_not_allowed"
	codePayloadTooLarge   = "payload_too_large"
	codeResourceExhausted = "resource_exhausted"
	codeInternal          = "internal"
	codeNotImplemented    = "not_implemented"
	codeUnavailable       = "unavailable"
)

// attributeCodes are the rejection codes of attribute assignments,
// answered as the error code itself (400).
var attributeCodes = map[buckets.Code]bool{
	buckets.CodeInvalidAttributeName:  true,
	buckets.CodeInvalidAttributeValue: true,
	buckets.CodeTooManyAttributes:     true,
}

// internalMessage is the only message a 500 ever carries.
const internalMessage = "internal error"

// apiError is an error that already knows its HTTP status, code and
// client-facing message. Messages start with the name of the parameter
// (or part of the request) at fault, e.g. `limit: must be ...`.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

// Unwrap lets callers match client errors against the buckets
// sentinels.
func (e *apiError) Unwrap() error {
	switch e.status {
	case http.StatusBadRequest:
		return buckets.ErrInvalidArgument
	case http.StatusNotFound:
		return buckets.ErrNotFound
	}
	return nil
}

// invalidArg is a 400 invalid_argument naming param.
func invalidArg(param, format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, codeInvalidArgument, param + ": " + fmt.Sprintf(format, args...)}
}

// notFound is a 404 not_found naming param.
func notFound(param, format string, args ...any) *apiError {
	return &apiError{http.StatusNotFound, codeNotFound, param + ": " + fmt.Sprintf(format, args...)}
}

// panicError carries a recovered panic to the error handler, which logs
// it once with its stack.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.value) }

// clientMessager is an error that words itself for the client.
type clientMessager interface{ ClientMessage() string }

// toAPIError maps any error a handler or middleware returns to what the
// client sees. It is the one place that turns errors into HTTP status
// codes. Internal details never reach the client: anything unknown is a
// 500 with the fixed message "internal error".
func (s *Server) toAPIError(err error) *apiError {
	var ae *apiError
	var he *echo.HTTPError
	var mbe *http.MaxBytesError
	var te *buckets.TableError
	var ve *buckets.ValidationError
	var cm clientMessager
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &ve) && attributeCodes[ve.Code]:
		// The attribute's own code, so a client can tell which rule of
		// which attribute it broke.
		return &apiError{http.StatusBadRequest, string(ve.Code), clientMessage(err)}
	case errors.As(err, &mbe):
		return tooLarge()
	case errors.As(err, &he):
		return fromEchoError(he)
	case errors.Is(err, buckets.ErrInvalidArgument), errors.Is(err, buckets.ErrInvalidReading):
		return &apiError{http.StatusBadRequest, codeInvalidArgument, clientMessage(err)}
	case errors.Is(err, buckets.ErrNotFound):
		return &apiError{http.StatusNotFound, codeNotFound, "request: not found"}
	case errors.As(err, &te):
		return &apiError{http.StatusServiceUnavailable, codeUnavailable, "store: " + te.ClientMessage()}
	case errors.As(err, &cm) && errors.Is(err, buckets.ErrUnavailable):
		// e.g. a cluster's partition that no owner answered: the
		// client learns which one.
		return &apiError{http.StatusServiceUnavailable, codeUnavailable, "cluster: " + cm.ClientMessage()}
	case errors.Is(err, buckets.ErrUnavailable):
		return &apiError{http.StatusServiceUnavailable, codeUnavailable, "store: temporarily unavailable; retry later"}
	case errors.Is(err, context.DeadlineExceeded):
		return &apiError{http.StatusServiceUnavailable, codeUnavailable,
			"request: did not finish within " + s.queryTimeout.String() + "; narrow the query or retry later"}
	case errors.Is(err, context.Canceled):
		return &apiError{http.StatusServiceUnavailable, codeUnavailable, "request: canceled"}
	}
	return &apiError{http.StatusInternalServerError, codeInternal, internalMessage}
}

// clientMessage words a client error that came from the reader: a
// ValidationError names its field; anything else is about the request.
func clientMessage(err error) string {
	var ve *buckets.ValidationError
	if errors.As(err, &ve) && ve.Field != "" {
		return ve.Field + ": " + ve.Msg
	}
	return "request: " + err.Error()
}

// readerError adds context to a reader's error for the log, except for
// client errors, whose text goes back to the client as it is.
func readerError(err error, format string, args ...any) error {
	if errors.Is(err, buckets.ErrInvalidArgument) || errors.Is(err, buckets.ErrInvalidReading) {
		return err
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

func tooLarge() *apiError {
	return &apiError{http.StatusRequestEntityTooLarge, codePayloadTooLarge,
		"body: request body is larger than " + strconv.Itoa(MaxBodyBytes) + " bytes"}
}

// fromEchoError maps the errors Echo itself produces (router 404/405,
// and anything else a framework component returns).
func fromEchoError(he *echo.HTTPError) *apiError {
	switch he.Code {
	case http.StatusNotFound:
		return &apiError{he.Code, codeNotFound, "path: no such endpoint"}
	case http.StatusMethodNotAllowed:
		return &apiError{he.Code, codeMethodNotAllowed, "method: not allowed on this path"}
	case http.StatusRequestEntityTooLarge:
		return tooLarge()
	case http.StatusBadRequest:
		return &apiError{he.Code, codeInvalidArgument, "request: malformed"}
	}
	if he.Code >= 400 && he.Code < 500 {
		return &apiError{he.Code, codeInvalidArgument, "request: " + http.StatusText(he.Code)}
	}
	return &apiError{http.StatusInternalServerError, codeInternal, internalMessage}
}

// handleError is Echo's HTTPErrorHandler: it writes the JSON error
// body and logs failures once (see logFailure). Client errors and the
// handlers' own answers (400, 404, 429, 503 from readiness) are not
// logged.
func (s *Server) handleError(err error, c echo.Context) {
	var deliberate *apiError
	answered := errors.As(err, &deliberate) // a handler's own answer, nothing to log
	ae := s.toAPIError(err)
	ctx := c.Request().Context()
	if !answered {
		s.logFailure(c, ae, err)
	}
	if c.Response().Committed {
		s.log.DebugContext(ctx, "error after the response was committed", "route", s.routeOf(c), "err", err)
		return
	}
	switch ae.status {
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		if c.Response().Header().Get("Retry-After") == "" {
			c.Response().Header().Set("Retry-After", "1")
		}
	case http.StatusUnauthorized:
		c.Response().Header().Set("WWW-Authenticate", `Bearer realm="telemetryd"`)
	}
	writeError(c, ae)
}

// logFailure logs an error that the server did not choose to answer
// with: 500s at error level (with the stack of a panic), 503s at warn,
// a client that went away at debug.
func (s *Server) logFailure(c echo.Context, ae *apiError, err error) {
	req := c.Request()
	ctx := req.Context()
	attrs := []any{"method", req.Method, "route", s.routeOf(c), "status", ae.status, "err", err}
	switch {
	case ae.status == http.StatusInternalServerError:
		var pe *panicError
		if errors.As(err, &pe) {
			attrs = append(attrs, "stack", string(pe.stack))
		}
		s.log.ErrorContext(ctx, "http request failed", attrs...)
		span := trace.SpanFromContext(ctx)
		span.RecordError(err)
		span.SetStatus(codes.Error, internalMessage)
	case errors.Is(err, context.Canceled):
		s.log.DebugContext(ctx, "http request canceled by the client", attrs...)
	case ae.status >= 500 && errors.As(err, new(*buckets.TableError)):
		// The store logged the table's failure when it happened and
		// counts it in telemetry.store.table_errors.
		s.log.DebugContext(ctx, "http request touched a failed day table", attrs...)
	case ae.status >= 500:
		s.log.WarnContext(ctx, "http request could not be served", attrs...)
	}
}

// writeError writes {"error":{"code":...,"message":...}}, or under the
// Prometheus API's path that API's error shape (promapi.WriteError).
func writeError(c echo.Context, ae *apiError) {
	if strings.HasPrefix(c.Request().URL.Path, promPrefix) {
		promapi.WriteError(c.Response(), ae.status, promErrorType(ae.code), ae.msg)
		return
	}
	body := ErrorResponse{Error: ErrorDetail{Code: ae.code, Message: ae.msg}}
	if err := sendValue(c, ae.status, body); err != nil {
		c.Response().WriteHeader(ae.status) // two strings always encode; keep the status regardless
	}
}

// promPrefix is where the Prometheus query API lives. Its clients
// (Grafana, promtool, the Prometheus Go client) read errors in the
// Prometheus shape, so the errors the middleware answers before the
// API runs (401, 403, 429, 503, 501) take that shape there too.
const promPrefix = "/api/v1/"

// promErrorType names a code in the Prometheus API's vocabulary where
// it has the word, else keeps the code.
func promErrorType(code string) promapi.ErrorType {
	switch code {
	case codeInvalidArgument, codePayloadTooLarge:
		return promapi.ErrorBadData
	case codeResourceExhausted, codeUnavailable:
		return promapi.ErrorUnavailable
	}
	return promapi.ErrorType(code) // not_found, internal, unauthenticated, permission_denied, ...
}
