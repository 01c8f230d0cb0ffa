package ingest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/wire"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"wildcard prefix", func(c *Config) { c.SubjectPrefix = "telemetry.*" }},
		{"empty token in prefix", func(c *Config) { c.SubjectPrefix = "a..b" }},
		{"dotted stream name", func(c *Config) { c.Stream = "A.B" }},
		{"same streams", func(c *Config) { c.RejectedStream = "TELEMETRY" }},
		{"negative max deliver", func(c *Config) { c.MaxDeliver = -1 }},
		{"more back-off steps than deliveries", func(c *Config) {
			c.MaxDeliver = 2
			c.BackOff = []time.Duration{time.Second, time.Second, time.Second}
		}},
		{"zero back-off step", func(c *Config) { c.BackOff = []time.Duration{0} }},
		{"negative batch wait", func(c *Config) { c.MaxBatchWait = -time.Second }},
	}
	nc := &nats.Conn{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.mod(&cfg)
			_, err := New(nc, &fakeWriter{}, cfg)
			assert.Error(t, err)
		})
	}
}

// Run creates both streams and the consumer as ingest/README.md says.
func TestRunCreatesStreamsAndConsumer(t *testing.T) {
	e := newTestEnv(t, func(c *Config) {
		c.AckWait = 3 * time.Second
		c.BackOff = []time.Duration{time.Second, 10 * time.Second}
		c.MaxDeliver = 4
	})
	require.ErrorIs(t, e.in.Ready(), errNotStarted)
	e.start()
	ctx := context.Background()

	st, err := e.js.Stream(ctx, "TELEMETRY")
	require.NoError(t, err)
	assert.Equal(t, []string{"telemetry.*"}, st.CachedInfo().Config.Subjects)
	assert.Equal(t, jetstream.FileStorage, st.CachedInfo().Config.Storage)
	assert.Equal(t, 7*24*time.Hour, st.CachedInfo().Config.MaxAge)
	assert.Equal(t, int64(4<<30), st.CachedInfo().Config.MaxBytes)

	rej, err := e.js.Stream(ctx, "TELEMETRY_REJECTED")
	require.NoError(t, err)
	assert.Equal(t, []string{"rejected.telemetry.*"}, rej.CachedInfo().Config.Subjects)
	assert.Equal(t, jetstream.FileStorage, rej.CachedInfo().Config.Storage)
	assert.Equal(t, 7*24*time.Hour, rej.CachedInfo().Config.MaxAge)
	assert.Equal(t, int64(1<<30), rej.CachedInfo().Config.MaxBytes)

	cc := e.consumerInfo().Config
	assert.Equal(t, "ingest", cc.Durable)
	assert.Equal(t, jetstream.AckExplicitPolicy, cc.AckPolicy)
	assert.Equal(t, -1, cc.MaxDeliver, "unbounded on the server: the ingester bounds a message's failed writes")
	assert.Equal(t, []time.Duration{3 * time.Second, 10 * time.Second}, cc.BackOff, "steps never below AckWait")
	assert.Equal(t, 3*time.Second, cc.AckWait)
	assert.Equal(t, minAckPending, cc.MaxAckPending, "slow start; paced up to 10000 by the commit rate")

	require.NoError(t, e.stop())
	assert.ErrorIs(t, e.in.Ready(), errStopped)
	assert.Error(t, e.in.Run(ctx), "a second Run")
}

// An existing stream keeps what an operator configured; the ingester
// only adds its subject and sets MaxAge.
func TestRunKeepsExistingStreamSettings(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.StreamMaxAge = 48 * time.Hour })
	ctx := context.Background()
	_, err := e.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "TELEMETRY", Subjects: []string{"legacy.>"}, Storage: jetstream.FileStorage, MaxMsgs: 12345,
		Description: "operator's",
	})
	require.NoError(t, err)
	e.start()
	st, err := e.js.Stream(ctx, "TELEMETRY")
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	assert.Equal(t, []string{"legacy.>", "telemetry.*"}, cfg.Subjects)
	assert.Equal(t, int64(12345), cfg.MaxMsgs)
	assert.Equal(t, "operator's", cfg.Description)
	assert.Equal(t, 48*time.Hour, cfg.MaxAge)
	e.waitAcked(e.publish("telemetry.dev-1", flat(nowMillis(), 1)))
}

func TestIngestWritesAndAcks(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	ms := nowMillis()
	e.publish("telemetry.dev-1", fmt.Sprintf(`{"ts":%d,"values":{"temp":21.5,"ok":true}}`, ms))
	e.publish("telemetry.dev-2", fmt.Sprintf(`{"ts":%d,"temp":20,"device":"dev-2"}`, ms))
	last := e.publish("telemetry.dev-3", fmt.Sprintf(`[{"ts":%d,"v":1},{"ts":%d,"v":2}]`, ms, ms+1))

	e.waitAcked(last)
	k, err := buckets.TicksFromEpochMillis(ms)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Reading{{Device: "dev-1", Ticks: k, Values: []buckets.Field{
		{Name: "ok", Value: buckets.Bool(true)}, {Name: "temp", Value: buckets.Float(21.5)}}}}, e.w.stored("dev-1"))
	assert.Equal(t, []buckets.Reading{{Device: "dev-2", Ticks: k, Values: []buckets.Field{
		{Name: "temp", Value: buckets.Int(20)}}}}, e.w.stored("dev-2"))
	assert.Len(t, e.w.stored("dev-3"), 2)
	info := e.consumerInfo()
	assert.Equal(t, last, info.Delivered.Stream)
	assert.Equal(t, 0, info.NumAckPending)
	assert.Zero(t, info.NumRedelivered)
	assert.Empty(t, e.deadLetters())

	assert.Equal(t, int64(4), e.counter("telemetry.ingest.readings", outcome("accepted")))
	// The acked count is recorded just after the acks are sent.
	assert.Eventually(t, func() bool { return e.counter("telemetry.ingest.messages", outcome("acked")) == 3 },
		5*time.Second, 5*time.Millisecond, "messages acked")
	lag, ok := e.collect()["telemetry.ingest.lag"].(metricdata.Histogram[float64])
	require.True(t, ok)
	require.Len(t, lag.DataPoints, 1)
	assert.Equal(t, uint64(4), lag.DataPoints[0].Count)
}

// A missing ts takes the time the stream stored the message, and a
// redelivery keeps it.
func TestIngestMissingTimestampUsesStreamTime(t *testing.T) {
	e := newTestEnv(t, nil)
	var failed atomic.Bool
	e.w.setFail(func([]buckets.Reading) error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("disk full")
		}
		return nil
	})
	e.start()
	seq := e.publish("telemetry.dev-1", `{"v":1}`)
	e.waitAcked(seq)

	st, err := e.js.Stream(context.Background(), "TELEMETRY")
	require.NoError(t, err)
	raw, err := st.GetMsg(context.Background(), seq)
	require.NoError(t, err)
	want := buckets.MustTicks(raw.Time)
	calls := e.w.snapshot()
	require.Len(t, calls, 2, "one failed write and its redelivery")
	assert.Equal(t, want, calls[0].readings[0].Ticks)
	assert.Equal(t, want, calls[1].readings[0].Ticks)
}

// Messages waiting in the stream are committed together: one Write per
// MaxBatchReadings readings, and a message is never split.
func TestIngestBatches(t *testing.T) {
	e := newTestEnv(t, func(c *Config) {
		c.MaxBatchReadings = 10
		c.MaxBatchWait = time.Second
	})
	e.setup()
	ms := nowMillis()
	var last uint64
	for i := range 25 {
		last = e.publish("telemetry.dev-1", flat(ms+int64(i), i))
	}
	e.start()
	e.waitAcked(last)
	var sizes []int
	for _, c := range e.w.snapshot() {
		sizes = append(sizes, len(c.readings))
	}
	assert.Equal(t, []int{10, 10, 5}, sizes, "readings per Write")

	// A message larger than the batch limit is committed alone, whole.
	var b strings.Builder
	b.WriteByte('[')
	for i := range 12 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(flat(ms+100+int64(i), i))
	}
	b.WriteByte(']')
	e.publish("telemetry.dev-2", flat(ms, 1))
	last = e.publish("telemetry.dev-2", b.String())
	e.waitAcked(last)
	sizes = nil
	for _, c := range e.w.snapshot()[3:] {
		sizes = append(sizes, len(c.readings))
	}
	assert.Equal(t, []int{1, 12}, sizes)

	hist, ok := e.collect()["telemetry.ingest.batch.size"].(metricdata.Histogram[int64])
	require.True(t, ok)
	require.Len(t, hist.DataPoints, 1)
	assert.Equal(t, uint64(5), hist.DataPoints[0].Count)
	assert.Equal(t, int64(38), hist.DataPoints[0].Sum)
}

func TestIngestManyMessagesOneWrite(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.MaxBatchWait = time.Second })
	e.setup()
	ms := nowMillis()
	var last uint64
	for i := range 200 {
		last = e.publish(fmt.Sprintf("telemetry.dev-%d", i%7), flat(ms+int64(i), i))
	}
	e.start()
	e.waitAcked(last)
	calls := e.w.snapshot()
	require.Len(t, calls, 1, "one Write for all waiting messages")
	assert.Len(t, calls[0].readings, 200)
}

// One bad reading rejects its whole message: nothing of it is stored,
// the original payload goes to rejected.telemetry.<device> with the
// reason, and ingest goes on.
func TestIngestRejectsInvalidMessage(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	ms := nowMillis()
	bad := fmt.Sprintf(`[{"ts":%d,"x":1},{"ts":%d,"x":null}]`, ms, ms+1)
	badSeq := e.publishMsg(&nats.Msg{Subject: "telemetry.dev-bad", Data: []byte(bad),
		Header: nats.Header{"Custom": []string{"kept"}}})
	last := e.publish("telemetry.dev-ok", flat(ms, 1))

	e.waitStored("dev-ok", 1)
	e.waitAcked(last)
	assert.Empty(t, e.w.stored("dev-bad"))
	assert.Zero(t, e.w.attempts("dev-bad"), "an invalid message is never written")

	dl := e.waitDeadLetters(1)
	require.Len(t, dl, 1)
	assert.Equal(t, "rejected.telemetry.dev-bad", dl[0].Subject)
	assert.Equal(t, bad, string(dl[0].Data))
	assert.Equal(t, "invalid_value", dl[0].Header.Get(topology.HeaderErrorCode))
	assert.Equal(t, "reading 1: values.x: null is not a value", dl[0].Header.Get(topology.HeaderError))
	assert.Equal(t, fmt.Sprint(badSeq), dl[0].Header.Get(topology.HeaderStreamSeq))
	assert.Equal(t, "kept", dl[0].Header.Get("Custom"))

	info := e.consumerInfo()
	assert.Equal(t, 0, info.NumAckPending, "the original is terminated")
	assert.Zero(t, info.NumRedelivered)

	assert.Equal(t, int64(2), e.counter("telemetry.ingest.readings", outcome("rejected"),
		attribute.String("code", "invalid_value")))
	assert.Equal(t, int64(1), e.counter("telemetry.ingest.messages", outcome("rejected")))
	assert.Equal(t, int64(1), e.counter("telemetry.ingest.readings", outcome("accepted")))
	logs := e.logs.String()
	assert.Contains(t, logs, "subject=telemetry.dev-bad")
	assert.Contains(t, logs, "code=invalid_value")
	assert.Contains(t, logs, fmt.Sprintf("stream_seq=%d", badSeq))
}

func TestIngestRejectsInvalidSubjectDevice(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	long := strings.Repeat("d", 65)
	e.publish("telemetry."+long, flat(nowMillis(), 1))
	e.publish("telemetry.bad!dev", flat(nowMillis(), 1))
	e.publish("telemetry.a*b", flat(nowMillis(), 1))
	ok := strings.Repeat("d", 64)
	last := e.publish("telemetry."+ok, flat(nowMillis(), 1))

	e.waitStored(buckets.DeviceID(ok), 1)
	e.waitAcked(last)
	dl := e.waitDeadLetters(3)
	var subjects []string
	for _, m := range dl {
		subjects = append(subjects, m.Subject)
		assert.Equal(t, "invalid_device", m.Header.Get(topology.HeaderErrorCode))
		assert.Contains(t, m.Header.Get(topology.HeaderError), "device: ")
	}
	assert.Equal(t, []string{"rejected.telemetry." + long, "rejected.telemetry.bad!dev", "rejected.telemetry._invalid"}, subjects)
	assert.Len(t, e.w.stored(""), 1)
}

// The accepted window uses the injected clock.
func TestIngestRejectsOutsideWindow(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	e := newTestEnv(t, func(c *Config) {
		c.Now = func() time.Time { return now }
		c.Window = buckets.Window{Retention: time.Hour, MaxFutureSkew: time.Minute}
	})
	e.start()
	oldest := now.Add(-time.Hour).UnixMilli()
	newest := now.Add(time.Minute).UnixMilli()
	e.publish("telemetry.old", flat(oldest-1, 1))
	e.publish("telemetry.future", flat(newest+1, 1))
	e.publish("telemetry.edge", fmt.Sprintf(`[%s,%s]`, flat(oldest, 1), flat(newest, 2)))

	stored := e.waitStored("edge", 2)
	assert.Len(t, stored, 2)
	dl := e.waitDeadLetters(2)
	codes := map[string]string{}
	for _, m := range dl {
		codes[m.Subject] = m.Header.Get(topology.HeaderErrorCode)
	}
	assert.Equal(t, map[string]string{"rejected.telemetry.old": "too_old", "rejected.telemetry.future": "too_far_in_future"}, codes)

	// The lag is measured against the injected clock. It is recorded
	// after the commit that waitStored sees, so wait for it.
	var lag metricdata.Histogram[float64]
	require.Eventually(t, func() bool {
		h, ok := e.collect()["telemetry.ingest.lag"].(metricdata.Histogram[float64])
		lag = h
		return ok && len(h.DataPoints) > 0 && h.DataPoints[0].Sum >= 3599
	}, 5*time.Second, 10*time.Millisecond, "lag histogram")
	assert.InDelta(t, 3600.0, lag.DataPoints[0].Sum, 0.01, "one reading 1h old, one in the future counted as 0")
}

// A transient store error is never acked: the message is redelivered
// with back-off and stored once the store recovers.
func TestIngestRetriesTransientWriteError(t *testing.T) {
	e := newTestEnv(t, nil)
	var broken atomic.Bool
	broken.Store(true)
	e.w.setFail(func([]buckets.Reading) error {
		if broken.Load() {
			return fmt.Errorf("disk full: %w", buckets.ErrUnavailable)
		}
		return nil
	})
	e.start()
	seq := e.publish("telemetry.dev-1", flat(nowMillis(), 1))

	require.Eventually(t, func() bool { return e.w.attempts("dev-1") >= 3 }, 10*time.Second, 10*time.Millisecond)
	info := e.consumerInfo()
	assert.Equal(t, 1, info.NumAckPending, "not acked while the store fails")
	assert.Less(t, info.AckFloor.Stream, seq)
	assert.Empty(t, e.w.stored("dev-1"))

	broken.Store(false)
	e.waitAcked(seq)
	calls := e.w.snapshot()
	require.NoError(t, calls[len(calls)-1].err, "the last write succeeded")
	assert.Equal(t, calls[0].readings, calls[len(calls)-1].readings, "the same reading was written again")
	assert.Len(t, e.w.stored("dev-1"), 1)
	assert.Empty(t, e.deadLetters())
	assert.GreaterOrEqual(t, e.counter("telemetry.ingest.messages", outcome("nak")), int64(3))
	assert.GreaterOrEqual(t, e.counter("telemetry.ingest.redeliveries"), int64(3))
	// The acked count is recorded just after the acks are sent.
	assert.Eventually(t, func() bool { return e.counter("telemetry.ingest.messages", outcome("acked")) == 1 },
		5*time.Second, 5*time.Millisecond, "messages acked")
}

// A message the store always refuses reaches the dead letter subject
// after MaxDeliver attempts, while other devices keep flowing.
func TestIngestPoisonMessage(t *testing.T) {
	e := newTestEnv(t, func(c *Config) {
		c.MaxDeliver = 3
		c.MaxBatchWait = 50 * time.Millisecond
	})
	e.w.setFail(func(rs []buckets.Reading) error {
		if hasDevice(rs, "poison") {
			return errors.New("poison: cannot store")
		}
		return nil
	})
	e.start()
	ms := nowMillis()
	poisonSeq := e.publish("telemetry.poison", flat(ms, 666))
	var last uint64
	for i := range 20 {
		last = e.publish("telemetry.good", flat(ms+int64(i), i))
		time.Sleep(5 * time.Millisecond)
	}

	assert.Len(t, e.waitStored("good", 20), 20)
	dl := e.waitDeadLetters(1)
	e.waitAcked(last)
	require.Len(t, dl, 1)
	assert.Equal(t, "rejected.telemetry.poison", dl[0].Subject)
	assert.Equal(t, flat(ms, 666), string(dl[0].Data))
	assert.Equal(t, "max_deliveries", dl[0].Header.Get(topology.HeaderErrorCode))
	assert.Contains(t, dl[0].Header.Get(topology.HeaderError), "not committed after 3 deliveries; last store error: poison: cannot store")
	assert.Equal(t, fmt.Sprint(poisonSeq), dl[0].Header.Get(topology.HeaderStreamSeq))

	alone := 0
	for _, c := range e.w.snapshot() {
		if len(c.readings) == 1 && c.readings[0].Device == "poison" {
			alone++
		}
	}
	assert.LessOrEqual(t, alone, 3, "at most one write of its own per delivery")
	assert.Empty(t, e.w.stored("poison"))
	assert.Equal(t, int64(1), e.counter("telemetry.ingest.readings", outcome("rejected"),
		attribute.String("code", "max_deliveries")))
	assert.Contains(t, e.logs.String(), "code=max_deliveries")
}

// A store that fails for longer than MaxDeliver deliveries (refusing
// writes, or its file system gone under it) never turns a message into
// a dead letter: it waits in the stream and is stored once the store
// writes again.
func TestIngestStoreDownNeverDeadLetters(t *testing.T) {
	e := newTestEnv(t, func(c *Config) {
		c.MaxDeliver = 2
		c.BackOff = []time.Duration{10 * time.Millisecond}
	})
	var calls atomic.Int32
	e.w.setFail(func([]buckets.Reading) error {
		switch n := calls.Add(1); {
		case n <= 3:
			return fmt.Errorf("table 2026-12-06: %w", buckets.ErrUnavailable)
		case n <= 6: // a FUSE disk whose daemon died
			return fmt.Errorf("commit: %w", &fs.PathError{Op: "truncate", Path: "00006.mem", Err: syscall.ECONNABORTED})
		}
		return nil
	})
	e.start()
	seq := e.publish("telemetry.dev-1", flat(nowMillis(), 1))

	e.waitAcked(seq)
	assert.GreaterOrEqual(t, calls.Load(), int32(7), "failed six times, past MaxDeliver, then stored")
	assert.Len(t, e.w.stored("dev-1"), 1)
	assert.Empty(t, e.deadLetters())
}

// Deliveries that were never settled (here writes that outlived their
// ack wait; after a restart or a power cut, deliveries the process did
// not live to settle) do not count towards MaxDeliver: the server keeps
// delivering and the message is stored, not dead-lettered.
func TestIngestUnsettledDeliveriesDoNotCount(t *testing.T) {
	e := newTestEnv(t, func(c *Config) {
		c.MaxDeliver = 2
		c.AckWait = 200 * time.Millisecond
		c.BackOff = []time.Duration{10 * time.Millisecond}
	})
	var calls atomic.Int32
	e.w.setFail(func([]buckets.Reading) error {
		if calls.Add(1) <= 3 {
			time.Sleep(600 * time.Millisecond) // past the ack wait: redelivered meanwhile
		}
		return nil
	})
	e.start()
	seq := e.publish("telemetry.slow", flat(nowMillis(), 1))

	e.waitAcked(seq)
	assert.Positive(t, e.counter("telemetry.ingest.redeliveries"), "delivered again while the first write ran")
	assert.NotEmpty(t, e.w.stored("slow"))
	assert.Empty(t, e.deadLetters(), "no dead letter for a message that was stored")
	assert.Zero(t, e.counter("telemetry.ingest.messages", outcome("rejected")))
}

// Every message the stream keeps is delivered: one published on a
// subject whose device token is a literal wildcard (the stream's
// "telemetry.*" captures "telemetry.>"), or on a subject an operator
// added to the stream, is dead-lettered with invalid_device, not left
// unread in the stream.
func TestIngestDeadLettersEverySubjectTheStreamKeeps(t *testing.T) {
	e := newTestEnv(t, nil)
	ctx := context.Background()
	_, err := e.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "TELEMETRY", Subjects: []string{"legacy.*"}, Storage: jetstream.FileStorage,
	})
	require.NoError(t, err)
	e.start()
	e.publish("telemetry.>", flat(nowMillis(), 1))
	e.publish("telemetry.*", flat(nowMillis(), 2))
	e.publish("legacy.dev-1", flat(nowMillis(), 3))
	last := e.publish("telemetry.dev-1", flat(nowMillis(), 4))

	e.waitStored("dev-1", 1)
	e.waitAcked(last)
	info := e.consumerInfo()
	assert.Equal(t, uint64(0), info.NumPending, "messages left unread in the stream")
	assert.Empty(t, info.Config.FilterSubjects)
	assert.Empty(t, info.Config.FilterSubject)
	dl := e.waitDeadLetters(3)
	var subjects []string
	for _, m := range dl {
		subjects = append(subjects, m.Subject+" "+m.Header.Get(topology.HeaderErrorCode))
	}
	assert.ElementsMatch(t, []string{
		"rejected.telemetry._invalid invalid_device",
		"rejected.telemetry._invalid invalid_device",
		"rejected.telemetry._invalid invalid_device",
	}, subjects)
	assert.Len(t, e.w.stored(""), 1)
	assert.Equal(t, int64(3), e.counter("telemetry.ingest.messages", outcome("rejected")))
}

// The consumer has no filter, so the server delivers the stream in
// order without matching each message's subject (its fast path); a
// consumer created with a filter by an earlier version loses it on the
// next set-up and then delivers every subject of the stream.
func TestConsumerUnfiltered(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.MQTTCopies = true })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := e.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "TELEMETRY", Subjects: []string{"telemetry.*", "$MQTT.msgs.telemetry.*"}, Storage: jetstream.FileStorage,
	})
	require.NoError(t, err)
	_, err = e.js.CreateConsumer(ctx, "TELEMETRY", jetstream.ConsumerConfig{
		Durable: "ingest", AckPolicy: jetstream.AckExplicitPolicy, FilterSubjects: []string{"telemetry.>"},
	})
	require.NoError(t, err)
	e.start()
	info := e.consumerInfo()
	assert.Empty(t, info.Config.FilterSubjects)
	assert.Empty(t, info.Config.FilterSubject)
	last := e.publish("telemetry.>", flat(nowMillis(), 1))
	e.waitAcked(last)
	dl := e.waitDeadLetters(1)
	assert.Equal(t, "rejected.telemetry._invalid", dl[0].Subject)
}

// A message with the binary form's header (package wire, published by
// the line protocol door) is decoded as such and checked like JSON: its
// readings are stored, one outside the window is dead-lettered with
// the binary payload and the reading count it declared. Without the
// header the same bytes are JSON, and invalid.
func TestIngestBinaryPayload(t *testing.T) {
	now := time.Now()
	e := newTestEnv(t, nil)
	e.start()
	rs := []buckets.Reading{
		{Ticks: mustTicks(t, now.Add(-time.Second)), Values: []buckets.Field{{Name: "s", Value: buckets.String("x")}, {Name: "v", Value: buckets.Float(1.5)}}},
		{Ticks: mustTicks(t, now), Values: []buckets.Field{{Name: "n", Value: buckets.Int(-3)}}},
	}
	var enc wire.Encoder
	enc.Reset()
	for _, r := range rs {
		enc.Add(r.Ticks, r.Values)
	}
	good := enc.Append(nil)
	hdr := nats.Header{wire.Header: []string{wire.Format}}
	e.publishMsg(&nats.Msg{Subject: "telemetry.bin", Data: good, Header: hdr})
	stored := e.waitStored("bin", 2)
	for i := range rs {
		rs[i].Device = "bin"
	}
	assert.ElementsMatch(t, rs, stored)

	enc.Reset()
	enc.Add(mustTicks(t, now.Add(-365*24*time.Hour)), rs[0].Values)
	enc.Add(rs[1].Ticks, rs[1].Values)
	old := enc.Append(nil)
	e.publishMsg(&nats.Msg{Subject: "telemetry.bin-old", Data: old, Header: hdr})
	last := e.publish("telemetry.bin-json", string(good))
	e.waitAcked(last)
	dl := e.waitDeadLetters(2)
	assert.Equal(t, "rejected.telemetry.bin-old", dl[0].Subject)
	assert.Equal(t, old, dl[0].Data)
	assert.Equal(t, "too_old", dl[0].Header.Get(topology.HeaderErrorCode))
	assert.Equal(t, wire.Format, dl[0].Header.Get(wire.Header), "kept, so the dead letter can be read back")
	assert.Equal(t, "rejected.telemetry.bin-json", dl[1].Subject)
	assert.Equal(t, "invalid_payload", dl[1].Header.Get(topology.HeaderErrorCode))
	assert.Equal(t, int64(2), e.counter("telemetry.ingest.readings", outcome("rejected"), attribute.String("code", "too_old")))
	assert.Empty(t, e.w.stored("bin-old"))
}

func mustTicks(t *testing.T, at time.Time) buckets.Ticks {
	t.Helper()
	k, err := buckets.TicksOf(at)
	require.NoError(t, err)
	return k
}
