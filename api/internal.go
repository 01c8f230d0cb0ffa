package api

import "github.com/labstack/echo/v4"

// internalPrefix is where Config.Internal is served: the node-to-node
// API of a cluster, admin scope only.
const internalPrefix = "/internal/"

// registerInternal routes Config.Internal, bounded like the queries
// and guarded like the admin endpoints.
func (s *Server) registerInternal(query []echo.MiddlewareFunc) {
	if s.internal == nil {
		return
	}
	s.echo.Any(internalPrefix+"*", echo.WrapHandler(s.internal), append(query, s.requireAdmin)...)
}
