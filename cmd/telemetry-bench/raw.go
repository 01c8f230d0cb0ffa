package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/api/cluster/nodewire"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// storeBatch is how many readings one store.Write gets: the ingester's
// default batch (ingest.DefaultConfig().MaxBatchReadings).
const storeBatch = 5000

// quietLogger drops everything.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// rawVariant is one way of writing with Badger alone.
type rawVariant struct {
	Name    string
	chunk   int // readings per WriteBatch; 0: one WriteBatch for everything
	writers int // goroutines writing chunks at once
	Rate    float64
}

// rawVariants are the raw Badger measurements; the best is the ceiling.
func rawVariants() []rawVariant {
	return []rawVariant{
		{Name: "one WriteBatch for all readings", writers: 1},
		{Name: fmt.Sprintf("WriteBatch per %d readings, 2 writers", storeBatch), chunk: storeBatch, writers: 2},
	}
}

// rawBadger writes w as one Badger entry per reading (key
// appendRawKey, value nodewire.AppendValues: the layout before
// blocks) with Badger WriteBatches, on a DB with the store's hot day
// table options, and returns readings/s. It is the baseline the store's
// write path is measured against: no reads, no merge, no reading
// counter, no device index, no blocks. With v.chunk 0 one
// WriteBatch takes everything (Badger sizes its transactions and
// pipelines their commits); otherwise v.writers goroutines each flush
// a WriteBatch of v.chunk readings at a time.
func rawBadger(dir string, w workload, v rawVariant, ph *phase) (float64, error) {
	db, err := badger.Open(store.TableBadgerOptions(dir, false, false, quietLogger()))
	if err != nil {
		return 0, fmt.Errorf("open badger: %w", err)
	}
	defer db.Close()
	perChunk := w.msgs
	if v.chunk > 0 {
		perChunk = max(1, v.chunk/w.perMsg)
	}
	chunks := (w.msgs + perChunk - 1) / perChunk
	start := time.Now()
	errs := make(chan error, v.writers)
	for g := range v.writers {
		go func() {
			for c := g; c < chunks; c += v.writers {
				if err := writeChunk(db, w, c*perChunk, min((c+1)*perChunk, w.msgs), ph); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range v.writers {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		return 0, err
	}
	return float64(w.readings()) / time.Since(start).Seconds(), nil
}

// writeChunk writes messages [from, to) of w with one WriteBatch.
func writeChunk(db *badger.DB, w workload, from, to int, ph *phase) error {
	wb := db.NewWriteBatch()
	defer wb.Cancel()
	var arena []byte
	fields := make([]buckets.Field, 0, 3)
	for m := from; m < to; m++ {
		if cap(arena)-len(arena) < 4096 {
			arena = make([]byte, 0, 1<<20) // WriteBatch keeps the slices until it commits
		}
		dev := w.device(m)
		for i := range w.perMsg {
			k := len(arena)
			arena = appendRawKey(arena, dev, buckets.MustTicks(w.at(m, i)))
			v := len(arena)
			arena = nodewire.AppendValues(arena, w.fields(fields[:0], m, i))
			if err := wb.Set(arena[k:v:v], arena[v:len(arena):len(arena)]); err != nil {
				return fmt.Errorf("write batch: %w", err)
			}
		}
		ph.add(w.perMsg)
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("flush write batch: %w", err)
	}
	return nil
}

// storeWrite writes w through store.Write in batches of storeBatch
// readings into a fresh store in dir and returns readings/s.
func storeWrite(ctx context.Context, dir string, w workload, ph *phase) (float64, error) {
	opts := store.DefaultOptions()
	opts.Logger = quietLogger()
	s, err := store.Open(ctx, dir, opts)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	rate, err := writeWorkload(ctx, s, w, ph)
	if err != nil {
		return 0, err
	}
	return rate, s.Close()
}

// writeWorkload writes every message of w with store.Write, storeBatch
// readings at a time, and returns readings/s.
func writeWorkload(ctx context.Context, s *store.Store, w workload, ph *phase) (float64, error) {
	batch := make([]buckets.Reading, 0, storeBatch+w.perMsg)
	start := time.Now()
	for m := range w.msgs {
		batch = w.appendReadings(batch, m)
		if len(batch) >= storeBatch || m == w.msgs-1 {
			if err := s.Write(ctx, batch); err != nil {
				return 0, fmt.Errorf("store write: %w", err)
			}
			ph.add(len(batch))
			clear(batch)
			batch = batch[:0]
		}
	}
	return float64(w.readings()) / time.Since(start).Seconds(), nil
}

// jsResult is what JetStream alone achieves with a workload's payloads,
// in messages per second.
type jsResult struct {
	perMsg   int
	publish  float64 // async publish until every ack, into an empty stream
	consume  float64 // Consume and ack each message, the stream filled beforehand
	pipeline float64 // publish and consume-and-ack at once, first publish to last ack
}

// rawJetStream measures w's payloads on an in-process NATS server with
// JetStream file storage under dir, with the stream and consumer
// settings the ingester uses, and no processing of the messages.
func rawJetStream(ctx context.Context, dir string, w workload, prog *progress) (jsResult, error) {
	res := jsResult{perMsg: w.perMsg}
	ns, err := startNATS(filepath.Join(dir, "filled"))
	if err != nil {
		return res, err
	}
	defer shutdownNATS(ns)
	name := fmt.Sprintf("raw JetStream %d/msg", w.perMsg)
	ph := prog.begin(name+" publish", w.msgs, "msgs")
	pub, err := withStream(ctx, ns, func(nc *nats.Conn) (pubStats, error) { return publishAll(ctx, nc, w, nil) })
	if err != nil {
		return res, err
	}
	res.publish = float64(pub.msgs) / pub.elapsed.Seconds()
	ph.end(fmt.Sprintf("%.0f msgs/s", res.publish))

	ph = prog.begin(name+" consume+ack (stream filled first)", w.msgs, "msgs")
	el, err := consumeAll(ctx, ns, w.msgs, ph, nil)
	if err != nil {
		return res, err
	}
	res.consume = float64(w.msgs) / el.Seconds()
	ph.end(fmt.Sprintf("%.0f msgs/s", res.consume))

	ns2, err := startNATS(filepath.Join(dir, "pipeline"))
	if err != nil {
		return res, err
	}
	defer shutdownNATS(ns2)
	ph = prog.begin(name+" publish and consume+ack at once", w.msgs, "msgs")
	if _, err := withStream(ctx, ns2, func(*nats.Conn) (pubStats, error) { return pubStats{}, nil }); err != nil {
		return res, err
	}
	el, err = consumeAll(ctx, ns2, w.msgs, ph, func(nc *nats.Conn) error {
		_, err := publishAll(ctx, nc, w, nil)
		return err
	})
	if err != nil {
		return res, err
	}
	res.pipeline = float64(w.msgs) / el.Seconds()
	ph.end(fmt.Sprintf("%.0f msgs/s", res.pipeline))
	return res, nil
}

// startNATS runs an in-process NATS server with JetStream storing under
// dir, configured like telemetryd's embedded server.
func startNATS(dir string) (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: dir, NoLog: true, NoSigs: true, MaxPayload: 8 << 20})
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("nats server not ready")
	}
	return ns, nil
}

func shutdownNATS(ns *server.Server) {
	ns.Shutdown()
	ns.WaitForShutdown()
}

// withStream creates the stream and the consumer as the ingester does,
// then runs f on a fresh connection.
func withStream(ctx context.Context, ns *server.Server, f func(nc *nats.Conn) (pubStats, error)) (pubStats, error) {
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return pubStats{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return pubStats{}, err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "TELEMETRY", Subjects: []string{"telemetry.*"},
		Storage: jetstream.FileStorage, MaxAge: 7 * 24 * time.Hour}); err != nil {
		return pubStats{}, fmt.Errorf("create stream: %w", err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "TELEMETRY", jetstream.ConsumerConfig{Durable: "ingest",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: 10, MaxAckPending: 10000,
		FilterSubject: "telemetry.*"}); err != nil {
		return pubStats{}, fmt.Errorf("create consumer: %w", err)
	}
	return f(nc)
}

// consumeAll consumes and acks n messages from the consumer "ingest"
// with the pull settings of the ingester, and returns the time until the
// server has every ack. When publish is set it runs at the same time on
// a connection of its own and the time starts before it.
func consumeAll(ctx context.Context, ns *server.Server, n int, ph *phase, publish func(nc *nats.Conn) error) (time.Duration, error) {
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	cons, err := js.Consumer(ctx, "TELEMETRY", "ingest")
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		_ = msg.Ack()
		ph.add(1)
	}, jetstream.PullMaxBytes(32<<20), jetstream.PullExpiry(10*time.Second))
	if err != nil {
		return 0, err
	}
	defer cc.Stop()
	pubErr := make(chan error, 1)
	if publish != nil {
		pnc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			return 0, err
		}
		defer pnc.Close()
		go func() {
			err := publish(pnc)
			if err != nil {
				cancel() // the acks cannot all arrive
			}
			pubErr <- err
		}()
	} else {
		pubErr <- nil
	}
	werr := waitAcked(ctx, cons, uint64(n))
	el := time.Since(start)
	if err := <-pubErr; err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	return el, werr
}

// waitAcked polls the consumer until the server has the acks of the
// first n stream messages.
func waitAcked(ctx context.Context, cons jetstream.Consumer, n uint64) error {
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("consumer info: %w", err)
		}
		if info.AckFloor.Stream >= n && info.NumAckPending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
