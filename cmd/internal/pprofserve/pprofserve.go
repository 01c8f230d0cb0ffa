// Package pprofserve serves net/http/pprof on a listener of its own
// (-pprof-addr), for profiling the hot paths.
package pprofserve

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"
)

// Handler routes the pprof endpoints under /debug/pprof/.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	return mux
}

// Server is a running pprof listener.
type Server struct {
	srv *http.Server
	wg  sync.WaitGroup
}

// Start serves Handler on addr in the background; a failure to listen
// is logged, not fatal. Shutdown stops it.
func Start(addr string, log *slog.Logger) *Server {
	s := &Server{srv: &http.Server{Addr: addr, Handler: Handler(), ReadHeaderTimeout: 5 * time.Second}}
	s.wg.Go(func() {
		log.Debug("pprof listening", "addr", addr) // the start-up line names it
		if err := s.srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof server", "err", err)
		}
	})
	return s
}

// Shutdown stops the listener and waits for it.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	s.wg.Wait()
	return err
}
