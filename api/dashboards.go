package api

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// registerDashboards routes the Prometheus query API through the same
// query middleware as the other queries. Without Config.PromQL those
// paths answer 501.
func (s *Server) registerDashboards(query []echo.MiddlewareFunc) {
	prom := func(c echo.Context) error {
		if s.promql == nil {
			return &apiError{http.StatusNotImplemented, codeNotImplemented, "path: the Prometheus query API is not served by this instance"}
		}
		s.promql.ServeHTTP(c.Response(), c.Request())
		return nil
	}
	for _, p := range []string{"/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels"} {
		s.echo.GET(p, prom, query...)
		s.echo.POST(p, prom, query...)
	}
	s.echo.GET("/api/v1/label/:name/values", prom, query...)
}
