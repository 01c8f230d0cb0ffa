package api

import (
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"golang.org/x/time/rate"

	"github.com/telemetryd/telemetryd/api/auth"
)

// maxRateKeys bounds the clients tracked by a rateLimiter. Past it the
// idle ones are forgotten; if every one is busy, new clients share one
// overflow bucket, so memory never grows with the number of addresses.
const maxRateKeys = 100_000

// rateLimiter is a token bucket per key (token name or client address).
// It is the store behind Echo's RateLimiter middleware (rateLimit), and
// is used directly for connections (connlimit.go) and failed logins
// (authn.go). Echo's own RateLimiterMemoryStore is not used because it
// differs in two ways that matter here: it keeps every client seen
// within its expiry (3 minutes by default), so a flood from many
// addresses (an IPv6 prefix holds billions) grows its map without
// bound, where this one holds at most maxRateKeys and then shares an
// overflow bucket; and its Allow says only no, where a 429 here says
// in Retry-After how long until a token is back (Allow returns that as
// a *rateDenied).
type rateLimiter struct {
	limit rate.Limit
	burst int

	mu       sync.Mutex
	buckets  map[string]*rateBucket
	overflow *rate.Limiter
}

type rateBucket struct {
	lim  *rate.Limiter
	last time.Time
}

// newRateLimiter returns a limiter of perSecond with burst, or nil
// (no limit) when perSecond is not positive.
func newRateLimiter(perSecond float64, burst int) *rateLimiter {
	if perSecond <= 0 {
		return nil
	}
	if burst < 1 {
		burst = max(1, int(math.Ceil(perSecond)))
	}
	return &rateLimiter{
		limit:    rate.Limit(perSecond),
		burst:    burst,
		buckets:  map[string]*rateBucket{},
		overflow: rate.NewLimiter(rate.Limit(perSecond), burst),
	}
}

// allow takes one token of key's bucket; when none is left it returns
// false and how long until one is.
func (r *rateLimiter) allow(key string, now time.Time) (bool, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	lim := r.bucket(key, now)
	if lim.AllowN(now, 1) {
		return true, 0
	}
	res := lim.ReserveN(now, 1)
	wait := res.DelayFrom(now)
	res.CancelAt(now)
	return false, wait
}

// rateDenied is the error Allow returns with false: the wait until the
// key has a token again.
type rateDenied struct{ wait time.Duration }

func (e *rateDenied) Error() string { return "rate limit exceeded; retry in " + e.wait.String() }

// Allow implements Echo's middleware.RateLimiterStore: it takes one
// token of key's bucket, and reports a *rateDenied when none is left.
func (r *rateLimiter) Allow(key string) (bool, error) {
	if ok, wait := r.allow(key, time.Now()); !ok {
		return false, &rateDenied{wait}
	}
	return true, nil
}

// bucket returns key's limiter, creating it. r.mu is held.
func (r *rateLimiter) bucket(key string, now time.Time) *rate.Limiter {
	if b, ok := r.buckets[key]; ok {
		b.last = now
		return b.lim
	}
	if len(r.buckets) >= maxRateKeys {
		// A bucket idle long enough to be full again is the same as a
		// new one: forget it.
		refill := time.Duration(float64(r.burst) / float64(r.limit) * float64(time.Second))
		for k, b := range r.buckets {
			if now.Sub(b.last) > refill {
				delete(r.buckets, k)
			}
		}
		if len(r.buckets) >= maxRateKeys {
			return r.overflow
		}
	}
	b := &rateBucket{lim: rate.NewLimiter(r.limit, r.burst), last: now}
	r.buckets[key] = b
	return b.lim
}

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
// *rateDenied), with Retry-After.
func (s *Server) rateExceeded(c echo.Context, err error) error {
	wait := time.Second
	if d, ok := err.(*rateDenied); ok {
		wait = d.wait
	}
	c.Response().Header().Set("Retry-After", retryAfter(wait))
	return &apiError{http.StatusTooManyRequests, codeResourceExhausted,
		"request: rate limit of " + strconv.FormatFloat(float64(s.rates.limit), 'f', -1, 64) +
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
