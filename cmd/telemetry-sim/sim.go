package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Timeouts of the publish pipeline.
const (
	ackTimeout     = 10 * time.Second       // longest wait for one publish ack
	drainTimeout   = 5 * time.Second        // longest wait for outstanding acks at the end
	errorBackoff   = 100 * time.Millisecond // pause after a publish the connection refused
	tracerName     = "github.com/telemetryd/telemetryd/cmd/telemetry-sim"
	maxDeviceRate  = 1000 // readings/s per device above which epoch-ms timestamps run ahead of the clock
	stopCount      = "count"
	stopDuration   = "duration"
	stopSignal     = "signal"
	stopFatalError = "error"
)

// errDurationReached is the cancel cause when -duration elapses.
var errDurationReached = errors.New("duration reached")

// runDeps are the simulator's collaborators; zero values select the
// defaults (slog.Default, the global tracer provider, time.Now).
type runDeps struct {
	Logger         *slog.Logger
	TracerProvider trace.TracerProvider // used only with -trace
	Now            func() time.Time     // reading timestamps and pacing
}

func (d runDeps) withDefaults() runDeps {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.TracerProvider == nil {
		d.TracerProvider = otel.GetTracerProvider()
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	return d
}

// summary is what one run did, in readings unless named otherwise.
type summary struct {
	Stopped    string // count, duration, signal or error
	Messages   int64
	Published  int64
	Acked      int64
	Duplicates int64
	Errors     int64
	Unacked    int64
	Elapsed    time.Duration
}

// Rate is the mean acknowledged readings per second.
func (s summary) Rate() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Acked) / s.Elapsed.Seconds()
}

// run connects to NATS and publishes simulated readings until -count,
// -duration or ctx ends it, then waits for outstanding acks (up to
// drainTimeout) and reports what happened. The error is about the run
// as a whole (cannot connect, messages too large); individual publish
// failures are counted in the summary.
func run(ctx context.Context, cfg config, deps runDeps) (summary, error) {
	deps = deps.withDefaults()
	log := deps.Logger
	seed := uint64(cfg.Seed)
	if seed == 0 {
		seed = uint64(deps.Now().UnixNano())
	}
	var js asyncPublisher
	var url string
	switch cfg.Protocol {
	case "mqtt":
		t, err := newMQTTTransport(cfg)
		if err != nil {
			return summary{}, err
		}
		defer t.close()
		js, url = t, cfg.MQTTURL
	case "line":
		js, url = newLineTransport(cfg), cfg.HTTPURL
	default:
		nc, err := nats.Connect(cfg.NATSURL, nats.Name("telemetry-sim"), nats.MaxReconnects(-1),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					log.Warn("nats disconnected", "err", err)
				}
			}),
			nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrlRedacted()) }))
		if err != nil {
			return summary{}, fmt.Errorf("connect to %s: %w", cfg.NATSURL, err)
		}
		defer nc.Close()
		jsc, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
			jetstream.WithPublishAsyncTimeout(ackTimeout))
		if err != nil {
			return summary{}, fmt.Errorf("jetstream: %w", err)
		}
		js, url = jsc, nc.ConnectedUrlRedacted()
	}
	var tracer trace.Tracer
	if cfg.Trace {
		tracer = deps.TracerProvider.Tracer(tracerName)
	}
	pub := newPublisher(js, cfg.MaxPending, tracer, []attribute.KeyValue{
		attribute.String("messaging.system", cfg.Protocol),
		attribute.String("messaging.operation.type", "send"),
	}, log)
	fl := newFleet(cfg, seed, deps.Now)

	log.Info("simulating", "protocol", cfg.Protocol, "url", url, "devices", cfg.Devices,
		"first", fl.devices[0].subject, "rate", cfg.Rate, "batch", cfg.Batch, "count", cfg.Count,
		"duration", cfg.Duration, "format", cfg.Format, "ts_format", cfg.TSFormat, "values", cfg.Values,
		"max_pending", cfg.MaxPending, "msg_id", cfg.MsgID, "trace", cfg.Trace, "seed", seed)
	if perDevice := cfg.Rate / float64(cfg.Devices); cfg.TSFormat == "epoch-ms" && (cfg.Rate == 0 || perDevice > maxDeviceRate) {
		log.Warn("epoch-ms timestamps are at least 1 ms apart per device and run ahead of the clock above 1000 readings/s per device; "+
			"add -devices or use -ts-format rfc3339", "per_device_rate", perDevice)
	}

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if cfg.Duration > 0 {
		stopTimer := time.AfterFunc(cfg.Duration, func() { cancel(errDurationReached) })
		defer stopTimer.Stop()
	}
	start := time.Now()
	stopProgress := startProgress(pub, cfg.Progress, log)
	stopped, runErr := produce(runCtx, cfg, fl, pub, deps.Now)
	pub.close(drainTimeout)
	stopProgress()

	sum := pub.summary(stopped, time.Since(start))
	sum.log(log)
	return sum, runErr
}

// produce generates and publishes messages until the count is reached
// or ctx is done, and says why it stopped.
func produce(ctx context.Context, cfg config, fl *fleet, pub *publisher, now func() time.Time) (string, error) {
	pc := newPacer(cfg.Rate, cfg.Batch, now())
	var sent int64
	for cfg.Count == 0 || sent < cfg.Count {
		n := cfg.Batch
		if cfg.Count > 0 {
			n = int(min(int64(n), cfg.Count-sent))
		}
		if err := pc.wait(ctx, n, now); err != nil {
			return stopReason(ctx), nil
		}
		buf := pub.buffer()
		m := fl.nextMessage(n, *buf)
		*buf = m.data
		err := pub.publish(ctx, m, cfg.MsgID, buf)
		switch {
		case ctx.Err() != nil:
			return stopReason(ctx), nil
		case err != nil && fatal(err):
			return stopFatalError, err
		case err != nil:
			// The connection refused the message (reconnecting with a
			// full buffer, say): the failure is counted; pause briefly
			// rather than spin through the rest of the count.
			if sleepCtx(ctx, errorBackoff) != nil {
				return stopReason(ctx), nil
			}
		}
		sent += int64(n)
	}
	return stopCount, nil
}

// stopReason names why ctx ended.
func stopReason(ctx context.Context) string {
	if errors.Is(context.Cause(ctx), errDurationReached) {
		return stopDuration
	}
	return stopSignal
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// summary snapshots the counters.
func (p *publisher) summary(stopped string, elapsed time.Duration) summary {
	return summary{
		Stopped:    stopped,
		Messages:   p.stats.messages.Load(),
		Published:  p.stats.published.Load(),
		Acked:      p.stats.acked.Load(),
		Duplicates: p.stats.duplicates.Load(),
		Errors:     p.stats.errors.Load(),
		Unacked:    p.stats.unacked.Load(),
		Elapsed:    elapsed,
	}
}

// log writes the final summary line, and a hint when the stream
// dropped messages as duplicates.
func (s summary) log(log *slog.Logger) {
	log.Info("done", "stopped", s.Stopped, "messages", s.Messages, "published", s.Published,
		"acked", s.Acked, "duplicates", s.Duplicates, "errors", s.Errors, "unacked", s.Unacked,
		"elapsed", s.Elapsed.Round(time.Millisecond), "rate", roundRate(s.Rate()))
	if s.Duplicates > 0 {
		log.Warn("the stream dropped readings whose Nats-Msg-Id it had already seen (a re-run inside its dedup window?); "+
			"use -seq-start to continue the sequence or -msg-id=false", "duplicates", s.Duplicates)
	}
}

func roundRate(r float64) float64 { return math.Round(r*10) / 10 }

// startProgress logs a progress line every interval until the returned
// function is called; that function stops the goroutine and waits for
// it. interval 0 disables progress lines.
func startProgress(pub *publisher, interval time.Duration, log *slog.Logger) func() {
	if interval <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		last, lastPub, lastAck := time.Now(), int64(0), int64(0)
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				pubN, ackN := pub.stats.published.Load(), pub.stats.acked.Load()
				secs := now.Sub(last).Seconds()
				attrs := []any{"published", pubN, "acked", ackN, "duplicates", pub.stats.duplicates.Load(),
					"errors", pub.stats.errors.Load(), "pending", pub.stats.pending.Load(),
					"publish_rate", roundRate(float64(pubN-lastPub) / secs),
					"ack_rate", roundRate(float64(ackN-lastAck) / secs)}
				if err := pub.takeLastErr(); err != nil {
					attrs = append(attrs, "last_error", err.Error())
				}
				log.Info("progress", attrs...)
				last, lastPub, lastAck = now, pubN, ackN
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
