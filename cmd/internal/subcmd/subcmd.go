// Package subcmd is what telemetryd gives its offline subcommands
// (check, retention, export, backup, restore): the service's own flags
// that they share (-data-dir, -retention, -log-level, ...), bound and
// validated by the service, so that each flag has one definition.
package subcmd

import (
	"flag"
	"io"
	"log/slog"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/telemetryd/telemetryd/cmd/internal/otelsetup"
	"github.com/telemetryd/telemetryd/store"
)

// Shared binds, parses and reads the service's flags for a
// subcommand. The service fills it; its functions share one
// configuration.
type Shared struct {
	// Bind registers on fs the service's flags of those names.
	Bind func(fs *flag.FlagSet, names ...string)
	// Usage makes fs print head, then every flag with its default and
	// its environment variable.
	Usage func(fs *flag.FlagSet, head string)
	// Parse parses args into fs, then the environment, and validates
	// the configuration. When the subcommand should stop (-h, or a bad
	// flag, reported on stderr) ok is false and code its exit status.
	Parse func(fs *flag.FlagSet, args []string) (code int, ok bool)
	// Values returns the shared settings (after Parse).
	Values func() Values
}

// Values are the service settings the subcommands use.
type Values struct {
	DataDir           string
	Retention         time.Duration
	RetentionMaxBytes int64
	LogLevel          string
	LogFormat         string
}

// Logger is the service's logger for these settings, writing to w.
func (v Values) Logger(w io.Writer) *slog.Logger {
	return otelsetup.NewLogger(v.LogLevel, v.LogFormat, w)
}

// StoreOptions are the store's defaults for a subcommand, logging to
// log. A subcommand exports no metrics or traces: its store gets no-op
// providers, never the process's global ones, which in a process that
// also runs the service (its tests) are that service's, whose gauges
// the subcommand's store would then overwrite.
func StoreOptions(log *slog.Logger) store.Options {
	o := store.DefaultOptions()
	o.Logger, o.MeterProvider, o.TracerProvider = log, metricnoop.NewMeterProvider(), tracenoop.NewTracerProvider()
	return o
}
