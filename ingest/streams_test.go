package ingest

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// TestOneDeviceCannotSuppressAnothersMessage pins the server behaviour
// the readings stream relies on: with its source, a zero duplicate
// window stays zero, and a message ID another device used first does
// not make a later message be acked as a duplicate and dropped. A
// server upgrade that brings the window back fails here.
func TestOneDeviceCannotSuppressAnothersMessage(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, "TELEMETRY")
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	assert.Zero(t, cfg.Duplicates, "effective duplicate window of the readings stream")
	assert.Equal(t, jetstream.DiscardNew, cfg.Discard)
	require.Len(t, cfg.Sources, 1)
	src, err := e.js.Stream(ctx, cfg.Sources[0].Name)
	require.NoError(t, err)
	assert.Equal(t, int64(1), src.CachedInfo().Config.MaxMsgs, "the source is bounded")

	ms := nowMillis()
	for i, id := range []string{"dev-a-42", "1", "lp-0123456789abcdef", "q2-1"} {
		// dev-b first, on its own subject, with the ID dev-a uses next.
		for _, dev := range []string{"dev-b", "dev-a"} {
			m := nats.NewMsg("telemetry." + dev)
			m.Data = []byte(flat(ms+int64(i), i))
			m.Header.Set(jetstream.MsgIDHeader, id)
			ack, err := e.js.PublishMsg(ctx, m)
			require.NoError(t, err)
			assert.False(t, ack.Duplicate, "%s's message with ID %q acked as a duplicate", dev, id)
		}
	}
	assert.Len(t, e.waitStored("dev-a", 4), 4)
	assert.Len(t, e.waitStored("dev-b", 4), 4)
}

// TestExistingStreamLosesItsDuplicateWindow: a stream created by an
// earlier version (2-minute window, discard old) is updated.
func TestExistingStreamLosesItsDuplicateWindow(t *testing.T) {
	e := newTestEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "TELEMETRY", Subjects: []string{"telemetry.*"}})
	require.NoError(t, err)
	m := nats.NewMsg("telemetry.dev-b")
	m.Data = []byte(flat(nowMillis(), 1))
	m.Header.Set(jetstream.MsgIDHeader, "7")
	_, err = e.js.PublishMsg(ctx, m)
	require.NoError(t, err)

	e.start()
	st, err := e.js.Stream(ctx, "TELEMETRY")
	require.NoError(t, err)
	assert.Zero(t, st.CachedInfo().Config.Duplicates)
	assert.Equal(t, jetstream.DiscardNew, st.CachedInfo().Config.Discard)
	// The server drops the IDs it remembered on a timer it fires when
	// the window changes, so they go within moments of the update, not
	// in the same instant: a publish may still be told duplicate until
	// then, never after. nats-server resets the timer before it takes
	// the new window, so when the timer fires first (a loaded machine)
	// the purge keeps the old window's IDs until that window (2
	// minutes) has passed: the wait allows for it.
	m = nats.NewMsg("telemetry.dev-a")
	m.Data = []byte(flat(nowMillis(), 2))
	m.Header.Set(jetstream.MsgIDHeader, "7")
	require.Eventually(t, func() bool {
		ack, err := e.js.PublishMsg(ctx, m)
		return err == nil && !ack.Duplicate
	}, 2*time.Minute+30*time.Second, 10*time.Millisecond, "an ID remembered from before the update still suppresses")
	e.waitStored("dev-a", 1)
}

// TestFullStreamRefusesInsteadOfDroppingAcked: before the ingester
// consumes, one device fills the stream; the readings another device
// had acked stay, the flooding device is refused with an error, and
// once the ingester runs every acked reading is stored.
func TestFullStreamRefusesInsteadOfDroppingAcked(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.StreamMaxBytes = 64 << 10 })
	e.setup()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ms := nowMillis()
	const acked = 20
	for i := range acked {
		e.publish("telemetry.dev-a", flat(ms+int64(i), i))
	}
	big := `{"ts":` + fmt.Sprint(ms) + `,"pad":"` + strings.Repeat("x", 4<<10) + `"` // invalid JSON: a reject
	var refused error
	for range 100 {
		if _, err := e.js.Publish(ctx, "telemetry.dev-b", []byte(big)); err != nil {
			refused = err
			break
		}
	}
	require.Error(t, refused, "a full stream refuses the publish")
	assert.ErrorContains(t, refused, "maximum bytes exceeded")

	e.start()
	got := e.waitStored("dev-a", acked)
	assert.Len(t, got, acked, "every acked reading of dev-a is stored")
	// Settled messages do not keep the stream full: publishing goes on.
	for i := range 40 {
		require.Eventually(t, func() bool {
			_, err := e.js.Publish(ctx, "telemetry.dev-b", []byte(big))
			return err == nil
		}, 20*time.Second, 20*time.Millisecond, "publish %d still refused: the stream stays full of settled messages", i)
	}
}

// TestFloodOfRejectsBlocksNobody: one device's flood of invalid
// payloads fills the dead-letter stream; the ingester keeps going,
// another device's dead letter is kept, and the flooding device keeps
// only its newest RejectedMaxPerDevice.
func TestFloodOfRejectsBlocksNobody(t *testing.T) {
	e := newTestEnv(t, func(c *Config) {
		c.RejectedMaxBytes, c.RejectedMaxPerDevice = 256<<10, 5
	})
	e.start()
	ms := nowMillis()
	e.publish("telemetry.dev-a", `{"ts":`+fmt.Sprint(ms)+`,"v":null}`)
	big := `{"ts":` + fmt.Sprint(ms) + `,"pad":"` + strings.Repeat("x", 4<<10) + `"`
	var last uint64
	for range 50 {
		last = e.publish("telemetry.dev-b", big)
	}
	seq := e.publish("telemetry.dev-a", flat(ms+1, 1))
	e.waitStored("dev-a", 1)
	e.waitAcked(max(seq, last))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, "TELEMETRY_REJECTED")
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	assert.Equal(t, jetstream.DiscardOld, cfg.Discard, "a dead letter is never refused")
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(">"))
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{"rejected.telemetry.dev-a": 1, "rejected.telemetry.dev-b": 5}, info.State.Subjects)
}

// TestTrimKeepsOtherPartitionsUnsettledMessages: the ingester of one
// partition purges only its own settled messages; another partition's
// messages, not consumed by anyone yet, all stay.
func TestTrimKeepsOtherPartitionsUnsettledMessages(t *testing.T) {
	srv := runServer(t, t.TempDir(), -1)
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	w := &fakeWriter{}
	cfg := partitionedConfig(2, 0)
	cfg.StreamMaxBytes, cfg.PaceEvery = 64<<10, 50*time.Millisecond
	in, ctx := runIngester(t, nc, w, cfg)
	require.Eventually(t, func() bool { return in.Ready() == nil }, 10*time.Second, 10*time.Millisecond)

	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var mine, other string // a device of partition 0 and one of partition 1
	for i := 0; mine == "" || other == ""; i++ {
		dev := fmt.Sprintf("dev-%d", i)
		if partition.Of(2, dev) == 0 {
			mine = cmp.Or(mine, dev)
		} else {
			other = cmp.Or(other, dev)
		}
	}
	pad := strings.Repeat("x", 1<<10)
	payload := func(n int) []byte { return fmt.Appendf(nil, `{"ts":%d,"v":%d,"pad":%q}`, 1795309323456+n, n, pad) }
	const unsettled = 20 // about a third of the stream
	for i := range unsettled {
		_, err := js.Publish(ctx, "telemetry."+other, payload(i))
		require.NoError(t, err)
	}
	for i := range 200 { // three times the stream
		require.Eventually(t, func() bool {
			_, err := js.Publish(ctx, "telemetry."+mine, payload(i))
			return err == nil
		}, 20*time.Second, 10*time.Millisecond, "publish %d of the consumed partition refused for good", i)
	}
	st, err := js.Stream(ctx, "TELEMETRY")
	require.NoError(t, err)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("telemetry.1.*"))
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{"telemetry.1." + other: unsettled}, info.State.Subjects,
		"the unconsumed partition's messages are all kept")
	require.Eventually(t, func() bool { return len(w.stored(buckets.DeviceID(mine))) == 200 }, 10*time.Second, 10*time.Millisecond)
}
