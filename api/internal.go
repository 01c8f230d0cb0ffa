package api

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/api/auth"
)

// internalPrefix is where Config.Internal is served: the node-to-node
// API of a cluster.
const internalPrefix = "/internal/"

// InternalAPI is a cluster's node-to-node API (package api/cluster).
// Its calls carry the cluster credential instead of a client token, and
// name the client they serve.
type InternalAPI interface {
	http.Handler
	// Authorize reports whether r carries the cluster credential and,
	// if so, the principal of the client the call serves (nil: no
	// authentication). err refuses a call with the credential all the
	// same (403).
	Authorize(r *http.Request) (caller *auth.Principal, credential bool, err error)
}

// registerInternal routes Config.Internal, bounded like the queries.
// authenticate has checked the cluster credential (authorizeInternal).
func (s *Server) registerInternal(query []echo.MiddlewareFunc) {
	if s.internal == nil {
		return
	}
	s.echo.Any(internalPrefix+"*", echo.WrapHandler(s.internal), query...)
}

type clusterCallKey struct{}

// clusterCall reports whether the request of ctx is a node-to-node call
// that carried the cluster credential. Such calls are not a client's:
// the client's own request was counted where it arrived, so they are
// left out of the per-client rate limit.
func clusterCall(ctx context.Context) bool {
	ok, _ := ctx.Value(clusterCallKey{}).(bool)
	return ok
}

// authorizeInternal admits a node-to-node call: 401 without the cluster
// credential (403 for a client token, however broad: the node-to-node
// API serves nodes only), 403 when the call names no caller this node
// knows. An admitted call runs with its caller's principal, so every
// later check applies the client's rights; it is marked as a cluster
// call (clusterCall). Refused attempts count against the client
// address's rate limit, as failed logins do.
func (s *Server) authorizeInternal(c echo.Context, next echo.HandlerFunc) error {
	req := c.Request()
	caller, ok, err := s.internal.Authorize(req)
	if !ok {
		if err := s.limitRate(c, ""); err != nil {
			return err
		}
		if secret, has := parseAuthorization(req.Header.Get(echo.HeaderAuthorization), false); has && s.tokens != nil {
			if p, known := s.tokens.Token(secret); known {
				return &apiError{http.StatusForbidden, codePermissionDenied,
					"authorization: token " + p.Name + " is not the cluster credential, the only one the node-to-node API accepts"}
			}
		}
		c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="telemetryd"`)
		return &apiError{http.StatusUnauthorized, codeUnauthenticated,
			"authorization: the node-to-node API needs the cluster credential"}
	}
	if err != nil {
		return &apiError{http.StatusForbidden, codePermissionDenied, "authorization: " + err.Error()}
	}
	ctx := context.WithValue(auth.WithPrincipal(req.Context(), caller), clusterCallKey{}, true)
	c.SetRequest(req.WithContext(ctx))
	return next(c)
}
