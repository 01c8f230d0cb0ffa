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
