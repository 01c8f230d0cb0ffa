package api

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// openAPIDoc is the hand-written OpenAPI 3.0 description of every
// route, served at GET /openapi.json.
//
//go:embed openapi.json
var openAPIDoc []byte

// OpenAPI returns the OpenAPI 3.0 document of the API (a copy).
func OpenAPI() []byte { return append([]byte(nil), openAPIDoc...) }

// handleOpenAPI serves GET /openapi.json.
func (s *Server) handleOpenAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPIDoc)
}
