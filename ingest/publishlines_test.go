package ingest

import (
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
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/buckets/wire"
	"github.com/telemetryd/telemetryd/ingest/lineproto"
	"github.com/telemetryd/telemetryd/ingest/lpwire"
	"github.com/telemetryd/telemetryd/ingest/partition"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// newPartitionEnv is a test env whose ingester consumes partition 0 of
// 4 streams per partition.
func newPartitionEnv(t *testing.T) *testEnv {
	e := newTestEnv(t, func(c *Config) {
		c.Partitions, c.PartitionStreams = 4, true
		*c = c.ForPartition(0)
	})
	e.start()
	return e
}

// devicesOf returns n device IDs with prefix of partition p of 4.
func devicesOf(prefix string, p, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if d := fmt.Sprintf("%s-%d", prefix, i); partition.Of(4, d) == p {
			out = append(out, d)
		}
	}
	return out
}

// mapLines maps line protocol lines of devs, two readings each of
// values 1 and 2 at the same times for every device: at and a second
// after (the same at gives the same messages).
func mapLines(t *testing.T, devs []string, at time.Time) []linemsg.Message {
	t.Helper()
	var b strings.Builder
	for _, d := range devs {
		fmt.Fprintf(&b, "m,device=%s v=1i %d\nm,device=%s v=2i %d\n", d, at.UnixNano(), d, at.Add(time.Second).UnixNano())
	}
	r, ok := lineproto.MapAll([]byte(b.String()), linemsg.Options{DeviceTags: []string{"device"}, Precision: time.Nanosecond, Now: time.Now(),
		Window: buckets.Window{Retention: buckets.DefaultRetention, MaxFutureSkew: buckets.DefaultMaxFutureSkew}})
	require.True(t, ok)
	require.Len(t, r.Messages, len(devs))
	return r.Messages
}

// partitionSubjects counts the stored messages of partition 0's stream
// by subject.
func (e *testEnv) partitionSubjects() map[string]uint64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, partition.Stream("TELEMETRY", 0))
	require.NoError(e.t, err)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("telemetry.>"))
	require.NoError(e.t, err)
	return info.State.Subjects
}

// TestPublisherSendsAWriteAsOneMessagePerPartition: the readings of
// three devices of a partition go as one message on the partition's
// write subject and are all stored; the same write again is suppressed
// (nothing published); a write of equal readings for other devices is
// published and stored.
func TestPublisherSendsAWriteAsOneMessagePerPartition(t *testing.T) {
	e := newPartitionEnv(t)
	p, err := NewPublisher(e.nc, e.cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	devs := devicesOf("w", 0, 5)
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	require.NoError(t, p.Publish(ctx, mapLines(t, devs[:3], at)))
	for _, d := range devs[:3] {
		e.waitStored(buckets.DeviceID(d), 2)
	}
	assert.Equal(t, map[string]uint64{"telemetry.0._lines": 1}, e.partitionSubjects())

	require.NoError(t, p.Publish(ctx, mapLines(t, devs[:3], at)))
	assert.Equal(t, int64(1), p.Suppressed(), "an identical retry is not published")
	assert.Equal(t, map[string]uint64{"telemetry.0._lines": 1}, e.partitionSubjects())

	require.NoError(t, p.Publish(ctx, mapLines(t, devs[3:], at)))
	for _, d := range devs[3:] {
		e.waitStored(buckets.DeviceID(d), 2)
	}
	assert.Equal(t, int64(1), p.Suppressed(), "equal readings of other devices are another message")
	assert.Equal(t, map[string]uint64{"telemetry.0._lines": 2}, e.partitionSubjects())
}

// TestWriteMessageOfAnotherPartitionIsDeadLettered: a message on
// partition 0's write subject that names a device of partition 1 is
// dead-lettered whole (invalid_device, naming the device), and nothing
// of it is stored; the same form on a device's own subject is refused
// too.
func TestWriteMessageOfAnotherPartitionIsDeadLettered(t *testing.T) {
	e := newPartitionEnv(t)
	ours, theirs := devicesOf("x", 0, 1)[0], devicesOf("x", 1, 1)[0]
	at, err := buckets.TicksOf(time.Now().Add(-time.Minute))
	require.NoError(t, err)
	var enc wire.Encoder
	enc.Add(at, []buckets.Field{{Name: "v", Value: buckets.Int(1)}})
	payload := enc.Append(nil)
	data := lpwire.Append(nil, []lpwire.Entry{{Device: buckets.DeviceID(ours), Payload: payload},
		{Device: buckets.DeviceID(theirs), Payload: payload}})
	m := nats.NewMsg("telemetry.0." + lpwire.Token)
	m.Header.Set(lpwire.Header, lpwire.Format)
	m.Data = data
	e.publishMsg(m)
	got := e.waitDeadLetters(1)
	assert.Equal(t, string(buckets.CodeInvalidDevice), got[0].Header.Get(topology.HeaderErrorCode))
	assert.Contains(t, got[0].Header.Get(topology.HeaderError), theirs+" belongs to partition 1 of 4")

	own := nats.NewMsg("telemetry.0." + ours)
	own.Header.Set(lpwire.Header, lpwire.Format)
	own.Data = lpwire.Append(nil, []lpwire.Entry{{Device: buckets.DeviceID(ours), Payload: payload}})
	e.publishMsg(own)
	got = e.waitDeadLetters(2)
	assert.Equal(t, string(buckets.CodeInvalidPayload), got[1].Header.Get(topology.HeaderErrorCode),
		"the form is read only on the write subject")
	assert.Empty(t, e.w.stored(buckets.DeviceID(ours)), "nothing of either message stored")
}

// TestRecentIDsForgetPastTheirBounds: an ID is remembered for recentFor
// and among the newest maxRecent, no longer.
func TestRecentIDsForgetPastTheirBounds(t *testing.T) {
	var r recentIDs
	t0 := time.Unix(1_800_000_000, 0)
	r.add("a", t0)
	assert.True(t, r.has("a", t0.Add(recentFor-time.Nanosecond)))
	assert.False(t, r.has("a", t0.Add(recentFor)), "past recentFor")
	assert.False(t, r.has("b", t0), "never added")
	for i := range maxRecent {
		r.add(fmt.Sprint(i), t0.Add(time.Second))
	}
	assert.False(t, r.has("a", t0.Add(time.Second)), "the oldest past maxRecent")
	assert.True(t, r.has("0", t0.Add(time.Second)))
	assert.Len(t, r.at, maxRecent)
	r.add("late", t0.Add(time.Second+recentFor))
	assert.Len(t, r.at, 1, "expired IDs are dropped as new ones come")
}
