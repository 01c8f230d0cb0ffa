package api

import (
	"io/fs"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/api/promapi"
	"github.com/telemetryd/telemetryd/api/ui"
)

// registerDashboards routes the Prometheus query API through the same
// query middleware as the other queries (without Config.PromQL those
// paths answer 501), and the built-in page under /ui/ ("/" redirects
// there). The page's files hold no data and load without a token (see
// uiPaths); every call the page makes for data needs one.
func (s *Server) registerDashboards(query []echo.MiddlewareFunc) {
	prom := func(c echo.Context) error {
		if s.promql == nil {
			return &apiError{http.StatusNotImplemented, codeNotImplemented, "path: the Prometheus query API is not served by this instance"}
		}
		// What the engine holds is bounded by its sample limit
		// (PromQLMaxSamples); the query takes its share of the response
		// budget for as long as it runs.
		res, err := s.reserveBytes(c, s.budget.size/promQueriesAtOnce)
		if err != nil {
			return err
		}
		defer res.release()
		s.promql.ServeHTTP(c.Response(), c.Request())
		return nil
	}
	for _, p := range []string{"/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels"} {
		s.echo.GET(p, prom, query...)
		s.echo.POST(p, prom, query...)
	}
	s.echo.GET("/api/v1/label/:name/values", prom, query...)
	for _, p := range promapi.GrafanaPaths {
		if p != "/api/v1/rules" {
			s.echo.GET(p, prom, query...)
		}
	}
	s.registerAlerts(query, prom)
	s.echo.POST("/api/v1/query_exemplars", prom, query...)

	files := ui.Files()
	s.echo.GET("/", func(c echo.Context) error { return c.Redirect(http.StatusFound, "/ui/") })
	s.echo.GET("/ui", func(c echo.Context) error { return c.Redirect(http.StatusMovedPermanently, "/ui/") })
	s.echo.GET("/ui/", func(c echo.Context) error { return serveUIFile(c, files, "index.html") })
	s.echo.GET("/ui/:file", func(c echo.Context) error {
		name := c.Param("file")
		if name == "index.html" {
			return c.Redirect(http.StatusMovedPermanently, "/ui/")
		}
		return serveUIFile(c, files, name)
	})
}

// uiPaths are the routes of the built-in page: static files that hold
// no data, so a browser loads them (and its sign-in form) without a
// token.
var uiPaths = map[string]bool{"/": true, "/ui": true, "/ui/": true, "/ui/:file": true}

// uiPolicy lets the page load only its own files and call only this
// server.
const uiPolicy = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'"

// serveUIFile serves one embedded file of the page, 404 when there is
// no such file.
func serveUIFile(c echo.Context, files fs.FS, name string) error {
	if !fs.ValidPath(name) {
		return notFound("path", "no such file")
	}
	if st, err := fs.Stat(files, name); err != nil || st.IsDir() {
		return notFound("path", "no such file")
	}
	h := c.Response().Header()
	h.Set("Content-Security-Policy", uiPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-cache")
	http.ServeFileFS(c.Response(), c.Request(), files, name)
	return nil
}
