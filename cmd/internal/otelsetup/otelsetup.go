// Package otelsetup builds telemetryd's OpenTelemetry providers from
// the standard OTEL_* environment variables: traces and metrics, OTLP
// export when configured, and a Prometheus exposition of every metric.
package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Providers are the OpenTelemetry providers of one service instance.
type Providers struct {
	Tracer   trace.TracerProvider
	Meter    metric.MeterProvider
	Metrics  http.Handler // Prometheus exposition of every metric
	shutdown []func(context.Context) error
}

// Options add span processors or metric readers (tests).
type Options struct {
	SpanProcessors []sdktrace.SpanProcessor
	MetricReaders  []sdkmetric.Reader
}

// New builds the providers from the standard OTEL_* variables:
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES for the resource,
// OTEL_TRACES_SAMPLER(_ARG) for sampling (read by the SDK), and OTLP
// export when OTEL_EXPORTER_OTLP_ENDPOINT (or the per-signal
// *_TRACES_/*_METRICS_ENDPOINT) is set, over gRPC or HTTP by
// OTEL_EXPORTER_OTLP_PROTOCOL. Prometheus exposition is always on.
//
// OTEL_SDK_DISABLED=true switches traces and metrics off entirely (no-op
// providers; /metrics then serves only the Go runtime metrics).
func New(ctx context.Context, getenv func(string) string, opts Options) (*Providers, error) {
	if getenv("OTEL_SDK_DISABLED") == "true" {
		return &Providers{Tracer: tracenoop.NewTracerProvider(), Meter: metricnoop.NewMeterProvider(),
			Metrics: promhttp.HandlerFor(runtimeRegistry(), promhttp.HandlerOpts{})}, nil
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("telemetryd")),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("otel resource: %w", err)
	}
	reg := runtimeRegistry()
	prom, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
	for _, r := range opts.MetricReaders {
		mopts = append(mopts, sdkmetric.WithReader(r))
	}
	topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	for _, p := range opts.SpanProcessors {
		topts = append(topts, sdktrace.WithSpanProcessor(p))
	}
	proto := envOr(getenv, "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	if otlpWanted(getenv, "TRACES") {
		exp, err := newSpanExporter(ctx, envOr(getenv, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", proto))
		if err != nil {
			return nil, err
		}
		topts = append(topts, sdktrace.WithBatcher(exp))
	}
	if otlpWanted(getenv, "METRICS") {
		exp, err := newMetricExporter(ctx, envOr(getenv, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", proto))
		if err != nil {
			return nil, err
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	tp, mp := sdktrace.NewTracerProvider(topts...), sdkmetric.NewMeterProvider(mopts...)
	return &Providers{
		Tracer:   tp,
		Meter:    mp,
		Metrics:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		shutdown: []func(context.Context) error{tp.Shutdown, mp.Shutdown},
	}, nil
}

// runtimeRegistry is a Prometheus registry with the Go runtime and
// process collectors.
func runtimeRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// otlpWanted reports whether OTLP export of signal is configured and
// not switched off with OTEL_<SIGNAL>_EXPORTER=none.
func otlpWanted(getenv func(string) string, signal string) bool {
	if e := getenv("OTEL_" + signal + "_EXPORTER"); e == "none" || e == "console" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
}

func newSpanExporter(ctx context.Context, proto string) (sdktrace.SpanExporter, error) {
	switch proto {
	case "grpc":
		return otlptracegrpc.New(ctx)
	case "http/protobuf", "http":
		return otlptracehttp.New(ctx)
	}
	return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", proto)
}

func newMetricExporter(ctx context.Context, proto string) (sdkmetric.Exporter, error) {
	switch proto {
	case "grpc":
		return otlpmetricgrpc.New(ctx)
	case "http/protobuf", "http":
		return otlpmetrichttp.New(ctx)
	}
	return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", proto)
}

// Install makes the providers and the W3C propagator the process
// globals, for libraries that use them.
func (t *Providers) Install() {
	otel.SetTracerProvider(t.Tracer)
	otel.SetMeterProvider(t.Meter)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
}

// Shutdown flushes and stops both providers.
func (t *Providers) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// TraceHandler adds trace_id and span_id to records logged with a
// context that holds a valid span.
type TraceHandler struct{ slog.Handler }

// Handle implements slog.Handler.
func (h TraceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h TraceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return TraceHandler{h.Handler.WithAttrs(as)}
}

// WithGroup implements slog.Handler.
func (h TraceHandler) WithGroup(name string) slog.Handler {
	return TraceHandler{h.Handler.WithGroup(name)}
}

// envOr returns the environment value of key, or def.
func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}

// ParseLevel reads a log level: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q must be debug, info, warn or error", s)
	}
	return l, nil
}

// NewLogger builds a logger writing text (or, with format "json",
// JSON) to w at level (info when it does not parse); records carry
// trace_id and span_id when their context holds a span.
func NewLogger(level, format string, w io.Writer) *slog.Logger {
	l, _ := ParseLevel(level)
	opts := &slog.HandlerOptions{Level: l}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(TraceHandler{Handler: h})
}
