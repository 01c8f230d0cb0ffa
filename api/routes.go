package api

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
)

// attributesPath is the route of the attribute writes (scope write).
const attributesPath = "/v1/devices/:device/attributes"

// readyTimeout bounds one readiness check.
const readyTimeout = 5 * time.Second

// registerRoutes builds the route table (api/README.md). Query routes are
// bounded in concurrency and time; admin routes need authorization.
// Every route here must be described in openapi.json (a test checks
// both directions).
func (s *Server) registerRoutes() {
	e := s.echo
	e.Use(s.observe, s.recoverPanic, s.authenticate, s.rateLimit(), limitBody, collectWarnings)

	query := []echo.MiddlewareFunc{s.limitInFlight, s.withTimeout}
	e.GET("/v1/devices/:device/readings/latest", s.handleLatest, query...)
	e.GET("/v1/devices/:device/readings", s.handleRange, query...)
	e.GET("/v1/devices/:device/readings/:ts", s.handlePoint, query...)
	e.GET("/v1/devices", s.handleDevices, query...)
	e.GET(devicePath, s.handleDevice, query...)
	e.PUT(attributesPath, s.handlePutAttributes, query...)
	e.PATCH(attributesPath, s.handlePatchAttributes, query...)
	e.GET("/v1/devices/:device/aggregates", s.handleAggregates, query...)
	s.registerDashboards(query)
	e.GET("/v1/tables", s.handleTables, query...)
	// An export is bounded per store call, not as a whole (handleExport).
	e.GET("/v1/export", s.handleExport, s.limitInFlight)

	e.DELETE("/v1/tables/:day", s.handleDropTable, s.requireAdmin)
	e.POST("/v1/tables/:day/repair", s.handleRepairTable, s.requireAdmin)
	e.DELETE(devicePath, s.handleDeleteDevice, s.requireAdmin)
	e.POST("/v1/retention/run", s.handleRetention, s.requireAdmin)
	e.POST(backupPath, s.handleBackup, s.requireAdmin)

	// Probes answer HEAD too: load balancers and uptime checkers use it.
	e.GET("/healthz", s.handleHealth)
	e.HEAD("/healthz", s.handleHealth)
	e.GET("/readyz", s.handleReady)
	e.HEAD("/readyz", s.handleReady)
	e.GET("/metrics", s.handleMetrics)
	e.GET("/openapi.json", s.handleOpenAPI)
	s.registerWriteRoutes(e)
	s.registerInternal(query)
	s.registerCluster(query)

	s.routes = make(map[string]string)
	for _, r := range e.Routes() {
		s.routes[r.Path] = routeTemplate(r.Path)
	}
}

// routeTemplate turns an Echo path ("/v1/tables/:day") into the
// OpenAPI form used in http.route and span names ("/v1/tables/{day}").
func routeTemplate(path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		if strings.HasPrefix(p, ":") {
			parts[i] = "{" + p[1:] + "}"
		}
	}
	return strings.Join(parts, "/")
}

// routeOf returns the route template the request matched, or "" when
// it matched none (so raw paths never become metric attributes).
func (s *Server) routeOf(c echo.Context) string { return s.routes[c.Path()] }

// handleHealth serves GET and HEAD /healthz: the process is alive.
func (s *Server) handleHealth(c echo.Context) error {
	return sendValue(c, http.StatusOK, Status{Status: "ok"})
}

// handleReady serves GET and HEAD /readyz: 200 when Config.Ready reports no
// error, with the durability mode (Config.Durability), else 503
// unavailable with the reason.
func (s *Server) handleReady(c echo.Context) error {
	if s.ready != nil {
		ctx, cancel := context.WithTimeout(c.Request().Context(), readyTimeout)
		defer cancel()
		if err := s.ready(ctx); err != nil {
			s.log.DebugContext(ctx, "not ready", "err", err)
			return &apiError{http.StatusServiceUnavailable, codeUnavailable, "readiness: " + err.Error()}
		}
	}
	return sendValue(c, http.StatusOK, Status{Status: "ready", Durability: s.durability.Durability, Ack: s.durability.Ack, Streams: s.durability.Streams})
}

// handleMetrics serves GET /metrics from Config.Metrics, 404 without.
func (s *Server) handleMetrics(c echo.Context) error {
	if s.metrics == nil {
		return notFound("path", "metrics are not served by this instance")
	}
	s.metrics.ServeHTTP(c.Response(), c.Request())
	return nil
}
