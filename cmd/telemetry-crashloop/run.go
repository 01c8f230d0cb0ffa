package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Run performs one crash loop and checks the result.
func Run(ctx context.Context, cfg Config, log *slog.Logger) (Result, error) {
	started := time.Now()
	res := Result{}
	work, err := os.MkdirTemp("", "telemetry-crashloop-")
	if err != nil {
		return res, err
	}
	if !cfg.Keep {
		defer os.RemoveAll(work)
	}
	if cfg.Binary == "" {
		if cfg.Binary, err = buildService(ctx, work); err != nil {
			return res, err
		}
	}
	if cfg.DataDir == "" {
		cfg.DataDir = filepath.Join(work, "data")
	}
	svc, err := newService(cfg, work, log)
	if err != nil {
		return res, err
	}
	log.Info("crash loop", "protocol", cfg.Protocol, "seed", cfg.Seed, "kills", cfg.Kills, "readings", cfg.Readings, "data_dir", cfg.DataDir, "log", svc.logPath)
	if err := svc.start(ctx); err != nil {
		return res, err
	}
	defer svc.stop(15 * time.Second)

	nc, err := nats.Connect("nats://"+svc.natsAddr, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectBufSize(-1))
	if err != nil {
		return res, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(5*time.Second),
		jetstream.WithPublishAsyncMaxPending(maxInFlight))
	if err != nil {
		return res, err
	}
	pub := &publisher{js: js, cfg: cfg, base: time.Now().Add(-time.Hour).Truncate(time.Second)}
	switch cfg.Protocol {
	case "", "nats":
	case "mqtt":
		ms, err := newMQTTSender(pub, svc.mqttAddr)
		if err != nil {
			return res, err
		}
		defer ms.close()
		pub.send = ms.send
	default:
		return res, fmt.Errorf("-protocol %q: want nats or mqtt", cfg.Protocol)
	}
	pubCtx, cancelPub := context.WithCancel(ctx)
	defer cancelPub()
	pubErr := make(chan error, 1)
	go func() { pubErr <- pub.run(pubCtx, log) }()

	stopProgress := progress(cfg.Progress, log, pub, &res)
	defer stopProgress()
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x5eed))
	for res.Kills < cfg.Kills {
		up := cfg.MinUp + time.Duration(rng.Int64N(int64(cfg.MaxUp-cfg.MinUp)+1))
		select {
		case <-time.After(up):
		case <-ctx.Done():
			return res, ctx.Err()
		}
		if err := svc.kill(); err != nil {
			return res, fmt.Errorf("kill %d: %w", res.Kills+1, err)
		}
		res.Kills++
		if err := svc.start(ctx); err != nil {
			return res, fmt.Errorf("restart after kill %d: %w", res.Kills, err)
		}
	}
	if err := <-pubErr; err != nil {
		return res, fmt.Errorf("publish: %w", err)
	}
	res.Published = int(pub.acked.Load())
	v := verifier{base: "http://" + svc.httpAddr, pub: pub}
	if err := v.waitStored(ctx, 120*time.Second); err != nil {
		log.Warn("store did not catch up", "error", err)
	}
	if err := v.check(ctx, &res); err != nil {
		return res, err
	}
	res.Elapsed = time.Since(started)
	if !res.OK() {
		return res, errors.New("delivery guarantee broken")
	}
	return res, nil
}

func newService(cfg Config, work string, log *slog.Logger) (*service, error) {
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	natsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	mqttAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return &service{bin: cfg.Binary, dataDir: cfg.DataDir, logPath: filepath.Join(work, "telemetryd.log"),
		httpAddr: httpAddr, natsAddr: natsAddr, mqttAddr: mqttAddr, args: cfg.Args, log: log}, nil
}

// progress logs acked readings and kills every interval until stopped.
func progress(every time.Duration, log *slog.Logger, pub *publisher, res *Result) (stop func()) {
	if every <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		last := int64(0)
		for {
			select {
			case <-done:
				return
			case <-t.C:
				acked := pub.acked.Load()
				log.Info("progress", "acked", acked, "publish_errors", pub.errors.Load(),
					"rate_per_s", float64(acked-last)/every.Seconds())
				last = acked
			}
		}
	}()
	return func() { close(done); <-finished }
}
