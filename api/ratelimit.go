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
	"golang.org/x/time/rate"

	"github.com/telemetryd/telemetryd/api/auth"
)

// maxRateKeys bounds the clients tracked by a rateLimiter. Past it the
// idle ones are forgotten; if every one is busy, new clients share one
// overflow bucket, so memory never grows with the number of addresses.
const maxRateKeys = 100_000

// rateLimiter is a token bucket per key (token name or client address).
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
	key := "a:" + clientAddr(c.Request().RemoteAddr)
	if tokenName != "" {
		key = "t:" + tokenName
	}
	ok, wait := s.rates.allow(key, time.Now())
	if ok {
		return nil
	}
	c.Response().Header().Set("Retry-After", retryAfter(wait))
	return &apiError{http.StatusTooManyRequests, codeResourceExhausted,
		"request: rate limit of " + strconv.FormatFloat(float64(s.rates.limit), 'f', -1, 64) +
			" requests/s exceeded; retry later"}
}

// rateLimit applies Config.RateLimit to every request but the liveness
// and readiness probes and a cluster's node-to-node calls (clusterCall),
// per token when the request carries one (see authenticate), else per
// client address.
func (s *Server) rateLimit(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		switch c.Path() {
		case "/healthz", "/readyz":
			return next(c)
		}
		if clusterCall(c.Request().Context()) {
			return next(c)
		}
		name := ""
		if p := auth.FromContext(c.Request().Context()); p != nil {
			name = p.Name
		}
		if err := s.limitRate(c, name); err != nil {
			return err
		}
		return next(c)
	}
}
