package api

import (
	"time"

	"github.com/telemetryd/telemetryd/api/limit"
)

// Server timeouts: a client that stops sending or reading loses its
// connection (and slot) instead of holding it.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	// writeTimeout bounds writing a response; it exceeds the longest
	// query (DefaultQueryTimeout) so a slow reader of a large range
	// keeps its slot and memory at most this long.
	writeTimeout   = 60 * time.Second
	idleTimeout    = 60 * time.Second
	maxHeaderBytes = 64 << 10
)

// connRates limits new connections per address at the request rate.
func (s *Server) connRates() *limit.Rates {
	if s.rates == nil {
		return nil
	}
	return limit.NewRates(s.rates.Limit(), s.rates.Burst())
}
