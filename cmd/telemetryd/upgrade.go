package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest"
)

// drainLeftovers starts draining every readings stream of an earlier
// layout (ingest.LeftoverStreams), each in a goroutine of wg, stopped
// by ctx.
func (m *Main) drainLeftovers(ctx context.Context, icfg ingest.Config, wg *sync.WaitGroup) error {
	js, err := jetstream.New(m.nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	left, err := ingest.LeftoverStreams(lctx, js, icfg)
	if err != nil {
		return fmt.Errorf("readings streams of an earlier layout: %w", err)
	}
	for _, c := range left {
		wg.Go(func() { ingest.DrainLeftover(ctx, m.nc, m.store, c) })
	}
	return nil
}

// checkMapping refuses to start with streams per partition when the
// NATS server does not map publishes to them (ingest.CheckMapping).
func (m *Main) checkMapping(icfg ingest.Config) error {
	js, err := jetstream.New(m.nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ingest.CheckMapping(ctx, js, icfg); err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	return nil
}
