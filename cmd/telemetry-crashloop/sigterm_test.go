package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/store"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
)

// TestSIGTERMUnderLoad stops a real telemetryd process with SIGTERM
// while readings pour in, against an external NATS server that keeps
// running. After the stop, the store must hold exactly the readings of
// the messages the service acked; after a restart, every reading the
// publisher got an ack for is stored once.
func TestSIGTERMUnderLoad(t *testing.T) {
	ns := ingesttest.RunNATS(t)

	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := buildService(ctx, work)
	require.NoError(t, err)
	cfg := Config{Binary: bin, DataDir: filepath.Join(work, "data"), Readings: 200000, Devices: 20, Batch: 10,
		Args: []string{"-nats-url", ns.ClientURL()}}
	svc, err := newService(cfg, work, log)
	require.NoError(t, err)
	require.NoError(t, svc.start(ctx))
	t.Cleanup(func() { _ = svc.kill() })

	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(maxInFlight))
	require.NoError(t, err)
	pub := &publisher{js: js, cfg: cfg, base: readingsBase(time.Now(), cfg.Readings)}
	pubCtx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan error, 1)
	go func() { pubDone <- pub.run(pubCtx, log) }()

	require.Eventually(t, func() bool { return pub.acked.Load() > 20000 }, time.Minute, 10*time.Millisecond)
	start := time.Now()
	require.NoError(t, svc.stop(10*time.Second), "SIGTERM must stop the service cleanly")
	t.Logf("stopped %s after SIGTERM with %d readings acked to the publisher", time.Since(start), pub.acked.Load())

	// Nothing delivered to the stopped service is left unacked, and the
	// store holds exactly the readings of the acked messages.
	cons, err := js.Consumer(ctx, "TELEMETRY", "ingest")
	require.NoError(t, err)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	// Messages the server had sent but the client had not yet received
	// stay pending until AckWait and are then redelivered; everything
	// else was either acked after commit or nak'ed for redelivery.
	t.Logf("at exit: delivered up to stream seq %d, ack floor %d, ack pending %d, redelivered %d",
		info.Delivered.Stream, info.AckFloor.Stream, info.NumAckPending, info.NumRedelivered)
	// Batches are committed and acked in stream order, so the acked
	// messages are exactly those up to the ack floor; the rest were
	// nak'ed on shutdown or are still pending.
	ackedMsgs := int64(info.AckFloor.Stream)
	st, err := store.Open(ctx, cfg.DataDir, store.DefaultOptions())
	require.NoError(t, err)
	tables, err := st.Tables(ctx)
	require.NoError(t, err)
	var stored int64
	for _, tb := range tables {
		stored += tb.Readings
	}
	require.NoError(t, st.Close())
	assert.Equal(t, ackedMsgs*int64(cfg.Batch), stored,
		"every committed reading was acked and every acked message was committed")

	// Finish publishing into the restarted service and check exactly once.
	require.NoError(t, svc.start(ctx))
	require.NoError(t, <-pubDone)
	stopPub()
	res := Result{Published: int(pub.acked.Load())}
	v := verifier{base: "http://" + svc.httpAddr, pub: pub}
	require.NoError(t, v.waitStored(ctx, time.Minute))
	require.NoError(t, v.check(ctx, &res))
	assert.Equal(t, cfg.Readings, res.Stored)
	assert.Zero(t, res.Lost)
	assert.Zero(t, res.Duplicated)
	assert.Zero(t, res.Unexpected)
	_ = os.Remove(svc.logPath)
}
