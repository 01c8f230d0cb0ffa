package api

import (
	"encoding/base64"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/api/auth"
)

// Tokens checks API token secrets (implemented by *auth.Store). With a
// nil Config.Auth the API is open (loopback-only mode, SECURITY.md).
type Tokens interface {
	// Token returns the principal of a token secret.
	Token(secret string) (*auth.Principal, bool)
}

// maxAuthHeader bounds the Authorization header that is parsed.
const maxAuthHeader = 4096

// Credential schemes accepted in the Authorization header.
const (
	schemeBearer = "bearer"
	schemeToken  = "token" // InfluxDB style, write endpoints only
	schemeBasic  = "basic" // token as the password, write endpoints only
)

// parseAuthorization extracts the token secret of an Authorization
// header. Bearer is accepted everywhere; Token and Basic (the token as
// the password, any user name) only when influx is set, as Telegraf
// and Influx clients send them. ok is false when the header is absent
// or not a usable credential.
func parseAuthorization(h string, influx bool) (secret string, ok bool) {
	if h == "" || len(h) > maxAuthHeader {
		return "", false
	}
	scheme, rest, found := strings.Cut(strings.TrimSpace(h), " ")
	if !found {
		return "", false
	}
	rest = strings.TrimSpace(rest)
	switch strings.ToLower(scheme) {
	case schemeBearer:
	case schemeToken:
		if !influx {
			return "", false
		}
	case schemeBasic:
		if !influx {
			return "", false
		}
		raw, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return "", false
		}
		_, pass, hasColon := strings.Cut(string(raw), ":")
		if !hasColon {
			return "", false
		}
		rest = pass
	default:
		return "", false
	}
	if rest == "" || strings.ContainsAny(rest, " \t\r\n") {
		return "", false
	}
	return rest, true
}

// access is what a route needs: open (no credential), or a scope.
type access struct {
	open   bool
	scope  auth.Scope
	influx bool // accepts Token and Basic credentials too
	// internal: the node-to-node API, which takes the cluster
	// credential instead of a token (authorizeInternal).
	internal bool
	// everyDevice: the route acts on every device's data at once
	// (dropping a day, retention, backups, repair), so a token limited
	// to device patterns is refused.
	everyDevice bool
}

// influxPaths are the line-protocol endpoints (ingest/README.md).
var influxPaths = map[string]bool{"/api/v2/write": true, "/write": true, "/query": true}

// accessOf maps a request to what it needs. route is the matched Echo
// route ("" when none matched: such requests still need a credential,
// so unauthenticated clients cannot probe which paths exist).
func accessOf(method, route, path string) access {
	p := route
	if p == "" {
		p = path
	}
	switch {
	case p == "/healthz" || p == "/readyz" || p == "/openapi.json", method == http.MethodGet && uiPaths[p]:
		return access{open: true}
	case p == "/metrics":
		return access{scope: auth.ScopeMetrics}
	case influxPaths[p]:
		return access{scope: auth.ScopeWrite, influx: true}
	case p == attributesPath && method != http.MethodGet && method != http.MethodHead:
		return access{scope: auth.ScopeWrite}
	case strings.HasPrefix(p, internalPrefix):
		return access{internal: true}
	case method == http.MethodDelete && p == devicePath:
		return access{scope: auth.ScopeAdmin} // the device is checked against the patterns
	case (method == http.MethodDelete && strings.HasPrefix(p, "/v1/tables/")) ||
		(method == http.MethodPost && strings.HasPrefix(p, "/v1/tables/") && strings.HasSuffix(p, "/repair")) ||
		p == "/v1/retention/run" || p == backupPath || p == reloadPath:
		return access{scope: auth.ScopeAdmin, everyDevice: true}
	default:
		return access{scope: auth.ScopeRead}
	}
}

// authenticate enforces the access rules of SECURITY.md when Config.Auth is set: 401 without
// a valid credential, 403 when the token lacks the route's scope, 404
// for a device outside the token's patterns (as if it did not exist).
// The principal is put in the request context, where handlers ask
// auth.Visible about each device they list.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		a := accessOf(req.Method, c.Path(), req.URL.Path)
		if a.internal {
			if s.internal != nil {
				return s.authorizeInternal(c, next)
			}
			a = access{scope: auth.ScopeRead} // not served here: any other unknown path
		}
		if s.tokens == nil {
			return next(c)
		}
		if a.open {
			return next(c)
		}
		secret, ok := parseAuthorization(req.Header.Get(echo.HeaderAuthorization), a.influx)
		var p *auth.Principal
		if ok {
			p, ok = s.tokens.Token(secret)
		}
		if !ok {
			if err := s.limitRate(c, ""); err != nil {
				return err
			}
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="telemetryd"`)
			msg := `authorization: this endpoint needs "Authorization: Bearer <token>"`
			if a.influx {
				msg = `authorization: this endpoint needs "Authorization: Token <token>", Bearer, or Basic with the token as password`
			}
			if req.Header.Get(echo.HeaderAuthorization) != "" {
				msg = "authorization: the token is not valid"
			}
			return &apiError{http.StatusUnauthorized, codeUnauthenticated, msg}
		}
		if !p.Has(a.scope) {
			return &apiError{http.StatusForbidden, codePermissionDenied,
				"authorization: token " + p.Name + " lacks the scope " + string(a.scope) + " this endpoint needs"}
		}
		if a.everyDevice && !p.AllDevices() {
			return &apiError{http.StatusForbidden, codePermissionDenied,
				"authorization: token " + p.Name + " is limited to device patterns, and this endpoint acts on every device's data; it needs a token for all devices"}
		}
		if dev := c.Param("device"); dev != "" && !p.DeviceVisible(dev) {
			return notFound("device", "%q is not known", dev)
		}
		c.SetRequest(req.WithContext(auth.WithPrincipal(req.Context(), p)))
		return next(c)
	}
}
