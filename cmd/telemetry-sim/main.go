// Command telemetry-sim simulates a fleet of devices publishing
// readings to the telemetry service over NATS JetStream, and doubles as
// a load generator.
//
// Each device sends smooth, noisy signals (temperature on a slow sine,
// humidity on a bounded random walk, a slowly draining battery) on
// <prefix>.<device>, paced by a token bucket from one reading a second
// to hundreds of thousands, with a bounded window of asynchronous
// publishes awaiting their JetStream acks. It logs a progress line
// every -progress and a summary at the end, and exits non-zero when any
// reading was not acknowledged.
//
// With -trace every publish is a producer span whose W3C traceparent
// travels in the message headers, so the service's ingest spans link
// to it; the spans are exported over OTLP when the standard
// OTEL_EXPORTER_OTLP_* variables name an endpoint.
//
// Usage:
//
//	telemetry-sim [flags]
//
// Every flag may also be set as TELEMETRY_SIM_<NAME> (upper case, '-'
// becomes '_'); a flag on the command line wins. See -help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(Main(context.Background(), os.Args[1:], os.Getenv, os.Stderr))
}

// Main runs the simulator with args and the environment read through
// getenv, logging to stderr, and returns the process exit code: 0 when
// every published reading was acknowledged, 1 when some were not or the
// run failed, 2 for bad flags. SIGINT or SIGTERM stops publishing and
// waits a few seconds for outstanding acks; a second signal exits at
// once.
func Main(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg := defaultConfig()
	if err := cfg.parse(args, getenv, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "telemetry-sim:", err)
		return 2
	}
	log := newLogger(cfg.LogFormat, stderr)

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// After the first signal, restore the default handling so a second
	// one ends the process without waiting for acks.
	unhook := context.AfterFunc(ctx, stop)
	defer unhook()

	deps := runDeps{Logger: log}
	if cfg.Trace {
		tp, err := newTracerProvider(ctx, getenv)
		if err != nil {
			log.Error("tracing", "err", err)
			return 1
		}
		defer func() {
			if err := shutdownTracer(tp); err != nil {
				log.Warn("flushing spans", "err", err)
			}
		}()
		deps.TracerProvider = tp
	}
	sum, err := run(ctx, cfg, deps)
	if err != nil {
		log.Error("simulator failed", "err", err)
		return 1
	}
	if sum.Errors > 0 || sum.Unacked > 0 {
		return 1
	}
	return 0
}
