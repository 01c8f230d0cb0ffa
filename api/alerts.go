package api

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"
)

// AlertsConfig is the rule evaluator's part of the API (api/rules).
type AlertsConfig struct {
	// Handler serves GET /api/v1/rules and GET /api/v1/alerts.
	Handler http.Handler
	// Reload loads the rule files again (POST /-/reload, admin); an
	// error (a bad file) is answered 400 and the old rules stay.
	Reload func(ctx context.Context) error
}

// reloadPath reloads the rule files (scope admin).
const reloadPath = "/-/reload"

// registerAlerts routes the rules and alerts API. Without rules,
// /api/v1/rules and /api/v1/alerts answer empty lists (Grafana's
// Prometheus data source asks them), and /-/reload 501.
func (s *Server) registerAlerts(query []echo.MiddlewareFunc, prom echo.HandlerFunc) {
	serve := func(c echo.Context) error {
		if s.alerts == nil || s.alerts.Handler == nil {
			if c.Path() == "/api/v1/alerts" {
				return c.JSONBlob(http.StatusOK, []byte(`{"status":"success","data":{"alerts":[]}}`))
			}
			return prom(c)
		}
		s.alerts.Handler.ServeHTTP(c.Response(), c.Request())
		return nil
	}
	s.echo.GET("/api/v1/rules", serve, query...)
	s.echo.GET("/api/v1/alerts", serve, query...)
	s.echo.POST(reloadPath, func(c echo.Context) error {
		if s.alerts == nil || s.alerts.Reload == nil {
			return &apiError{http.StatusNotImplemented, codeNotImplemented, "path: no rule files are loaded by this instance (-rules)"}
		}
		if err := s.alerts.Reload(c.Request().Context()); err != nil {
			return invalidArg("rules", "%v", err)
		}
		return sendValue(c, http.StatusOK, Status{Status: "ok"})
	}, s.requireAdmin)
}
