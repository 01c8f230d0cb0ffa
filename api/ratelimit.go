package api

import (
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/api/limit"
)

// retryAfter renders a wait as whole seconds, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

// clientAddr is the TCP peer's address (never a forwarding header,
// which a client could forge).
func clientAddr(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return remoteAddr
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap().String()
	}
	return host
}

// limitRate charges one request to the token named tokenName, or to
// the client address when it is empty, and answers 429 with Retry-After
// past Config.RateLimit.
func (s *Server) limitRate(c echo.Context, tokenName string) error {
	if s.rates == nil {
		return nil
	}
	if _, err := s.rates.Allow(rateKey(c, tokenName)); err != nil {
		return s.rateExceeded(c, err)
	}
	return nil
}

// rateKey is the bucket of a request: its token's, else its client
// address's.
func rateKey(c echo.Context, tokenName string) string {
	if tokenName != "" {
		return "t:" + tokenName
	}
	return "a:" + clientAddr(c.Request().RemoteAddr)
}

// rateExceeded is the 429 of a request refused with err (a
// *limit.Denied), with Retry-After.
func (s *Server) rateExceeded(c echo.Context, err error) error {
	wait := time.Second
	if d, ok := err.(*limit.Denied); ok {
		wait = d.Wait
	}
	c.Response().Header().Set("Retry-After", retryAfter(wait))
	return &apiError{http.StatusTooManyRequests, codeResourceExhausted,
		"request: rate limit of " + strconv.FormatFloat(s.rates.Limit(), 'f', -1, 64) +
			" requests/s exceeded; retry later"}
}

// rateLimit is Echo's RateLimiter middleware applying Config.RateLimit
// to every request but the liveness and readiness probes and a
// cluster's node-to-node calls (clusterCall), per token when the
// request carries one (see authenticate), else per client address (the
// TCP peer, never a forwarding header). Without a limit it passes every
// request on.
func (s *Server) rateLimit() echo.MiddlewareFunc {
	if s.rates == nil {
		return func(next echo.HandlerFunc) echo.HandlerFunc { return next }
	}
	return middleware.RateLimiterWithConfig(middleware.RateLimiterConfig{
		Skipper: func(c echo.Context) bool {
			p := c.Path()
			return p == "/healthz" || p == "/readyz" || clusterCall(c.Request().Context())
		},
		IdentifierExtractor: func(c echo.Context) (string, error) {
			name := ""
			if p := auth.FromContext(c.Request().Context()); p != nil {
				name = p.Name
			}
			return rateKey(c, name), nil
		},
		Store: s.rates,
		DenyHandler: func(c echo.Context, _ string, err error) error {
			return s.rateExceeded(c, err)
		},
	})
}
