// Package limit bounds what clients of the HTTP API may take: requests
// per second per token or address (Rates, a token bucket per key with a
// bounded number of keys), and connections at once, per address and in
// all (Listener, which refuses past a limit at once instead of queuing).
package limit

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxKeys bounds the clients tracked by a Rates. Past it the
// idle ones are forgotten; if every one is busy, new clients share one
// overflow bucket, so memory never grows with the number of addresses.
const maxKeys = 100_000

// Rates is a token bucket per key (token name or client address).
// It is the store behind Echo's RateLimiter middleware (the api
// package's rateLimit), and is used directly for connections
// (Listener) and failed logins. Echo's own RateLimiterMemoryStore is not used because it
// differs in two ways that matter here: it keeps every client seen
// within its expiry (3 minutes by default), so a flood from many
// addresses (an IPv6 prefix holds billions) grows its map without
// bound, where this one holds at most maxKeys and then shares an
// overflow bucket; and its Allow says only no, where a 429 here says
// in Retry-After how long until a token is back (Allow returns that as
// a *Denied).
type Rates struct {
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

// NewRates returns a limiter of perSecond with burst, or nil
// (no limit) when perSecond is not positive.
func NewRates(perSecond float64, burst int) *Rates {
	if perSecond <= 0 {
		return nil
	}
	if burst < 1 {
		burst = max(1, int(math.Ceil(perSecond)))
	}
	return &Rates{
		limit:    rate.Limit(perSecond),
		burst:    burst,
		buckets:  map[string]*rateBucket{},
		overflow: rate.NewLimiter(rate.Limit(perSecond), burst),
	}
}

// Take takes one token of key's bucket; when none is left it returns
// false and how long until one is.
func (r *Rates) Take(key string, now time.Time) (bool, time.Duration) {
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

// Denied is the error Allow returns with false: the wait until the
// key has a token again.
type Denied struct{ Wait time.Duration }

func (e *Denied) Error() string { return "rate limit exceeded; retry in " + e.Wait.String() }

// Allow implements Echo's middleware.RateLimiterStore: it takes one
// token of key's bucket, and reports a *Denied when none is left.
func (r *Rates) Allow(key string) (bool, error) {
	if ok, wait := r.Take(key, time.Now()); !ok {
		return false, &Denied{Wait: wait}
	}
	return true, nil
}

// bucket returns key's limiter, creating it. r.mu is held.
func (r *Rates) bucket(key string, now time.Time) *rate.Limiter {
	if b, ok := r.buckets[key]; ok {
		b.last = now
		return b.lim
	}
	if len(r.buckets) >= maxKeys {
		// A bucket idle long enough to be full again is the same as a
		// new one: forget it.
		refill := time.Duration(float64(r.burst) / float64(r.limit) * float64(time.Second))
		for k, b := range r.buckets {
			if now.Sub(b.last) > refill {
				delete(r.buckets, k)
			}
		}
		if len(r.buckets) >= maxKeys {
			return r.overflow
		}
	}
	b := &rateBucket{lim: rate.NewLimiter(r.limit, r.burst), last: now}
	r.buckets[key] = b
	return b.lim
}

// Limit is the rate in tokens a second; Burst the bucket's size.
func (r *Rates) Limit() float64 { return float64(r.limit) }

// Burst is how many tokens a full bucket holds.
func (r *Rates) Burst() int { return r.burst }
