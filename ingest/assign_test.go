package ingest

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/wire"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// A message's attributes are assigned as of its readings' times, before
// its readings are written and before it is acked.
func TestIngestAssignsAttributes(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	ms := nowMillis()
	e.publish("telemetry.truck-1", fmt.Sprintf(`{"ts":%d,"fuel":0.4,"attributes":{"fleet":"East","model":"F-150"}}`, ms))
	last := e.publish("telemetry.truck-2", fmt.Sprintf(`[{"ts":%d,"fuel":0.9,"attributes":{"fleet":"West"}},{"ts":%d,"fuel":0.8}]`, ms, ms+1))
	e.waitAcked(last)

	k, err := buckets.TicksFromEpochMillis(ms)
	require.NoError(t, err)
	as := e.w.assigned()
	slices.SortFunc(as, func(a, b buckets.Assignment) int { return strings.Compare(string(a.Device), string(b.Device)) })
	assert.Equal(t, []buckets.Assignment{
		{Device: "truck-1", At: k, Set: attrs("fleet", "East", "model", "F-150")},
		{Device: "truck-2", At: k, Set: attrs("fleet", "West")},
	}, as)
	assert.Len(t, e.w.stored("truck-1"), 1)
	assert.Len(t, e.w.stored("truck-2"), 2)
	assert.Empty(t, e.deadLetters())
}

// Invalid attributes reject the message whole: nothing of it is
// assigned or written, and the dead letter names the attribute.
func TestIngestRejectsInvalidAttributes(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	ms := nowMillis()
	bad := fmt.Sprintf(`[{"ts":%d,"v":1,"attributes":{"fleet":"East"}},{"ts":%d,"v":2,"attributes":{"fleet":7}}]`, ms, ms+1)
	e.publish("telemetry.bad", bad)
	last := e.publish("telemetry.ok", flat(ms, 1))
	e.waitAcked(last)
	dl := e.waitDeadLetters(1)
	assert.Equal(t, "rejected.telemetry.bad", dl[0].Subject)
	assert.Equal(t, bad, string(dl[0].Data))
	assert.Equal(t, "invalid_attribute_value", dl[0].Header.Get(topology.HeaderErrorCode))
	assert.Equal(t, "reading 1: attributes.fleet: an attribute value must be a string, got a number", dl[0].Header.Get(topology.HeaderError))
	assert.Zero(t, e.w.attempts("bad"))
	assert.Empty(t, e.w.assigned())
}

// A failed Assign is retried like a failed write: the message is not
// acked and its readings are not written until the assignment is
// applied; the redelivery applies the same assignment.
func TestIngestRetriesTransientAssignError(t *testing.T) {
	e := newTestEnv(t, nil)
	var broken atomic.Bool
	broken.Store(true)
	e.w.setFailAssign(func([]buckets.Assignment) error {
		if broken.Load() {
			return fmt.Errorf("disk full: %w", buckets.ErrUnavailable)
		}
		return nil
	})
	e.start()
	seq := e.publish("telemetry.dev-1", fmt.Sprintf(`{"ts":%d,"v":1,"attributes":{"fleet":"East"}}`, nowMillis()))

	require.Eventually(t, func() bool {
		e.w.mu.Lock()
		defer e.w.mu.Unlock()
		return len(e.w.assigns) >= 3
	}, 10*time.Second, 10*time.Millisecond)
	info := e.consumerInfo()
	assert.Equal(t, 1, info.NumAckPending, "not acked while Assign fails")
	assert.Zero(t, e.w.attempts("dev-1"), "readings wait for their attributes")

	broken.Store(false)
	e.waitAcked(seq)
	assert.Len(t, e.w.stored("dev-1"), 1)
	assert.Equal(t, map[buckets.DeviceID]map[string]string{"dev-1": {"fleet": "East"}}, e.w.attributes())
	assert.Empty(t, e.deadLetters())
	assert.GreaterOrEqual(t, e.counter("telemetry.ingest.messages", outcome("nak")), int64(3))
}

// An assignment the store refuses (a device left with too many
// attributes) dead-letters its message with the store's code and
// nothing of it is written; the other messages of its batch are
// committed.
func TestIngestDeadLettersAssignmentTheStoreRefuses(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.MaxBatchWait = 200 * time.Millisecond })
	e.w.setFailAssign(func(as []buckets.Assignment) error {
		for _, a := range as {
			if a.Device == "full" {
				return buckets.Invalid(buckets.CodeTooManyAttributes, -1, "attributes", "device full would have 65 attributes, at most 64 are allowed")
			}
		}
		return nil
	})
	e.start()
	ms := nowMillis()
	e.publish("telemetry.other", fmt.Sprintf(`{"ts":%d,"v":1,"attributes":{"fleet":"East"}}`, ms))
	e.publish("telemetry.full", fmt.Sprintf(`{"ts":%d,"v":1,"attributes":{"extra":"x"}}`, ms))
	last := e.publish("telemetry.plain", flat(ms, 1))
	e.waitAcked(last)
	dl := e.waitDeadLetters(1)
	require.Len(t, dl, 1)
	assert.Equal(t, "rejected.telemetry.full", dl[0].Subject)
	assert.Equal(t, "too_many_attributes", dl[0].Header.Get(topology.HeaderErrorCode))
	assert.Contains(t, dl[0].Header.Get(topology.HeaderError), "65 attributes")
	assert.Empty(t, e.w.stored("full"), "rejected whole: its readings are not written")
	assert.Len(t, e.w.stored("other"), 1)
	assert.Len(t, e.w.stored("plain"), 1)
	assert.Equal(t, map[buckets.DeviceID]map[string]string{"other": {"fleet": "East"}}, e.w.attributes())
}

// The binary form's assignments are applied, and one holding as of a
// time outside the accepted window rejects its message.
func TestIngestBinaryAssignments(t *testing.T) {
	now := time.Now()
	e := newTestEnv(t, nil)
	e.start()
	var enc wire.Encoder
	enc.Reset()
	enc.Add(mustTicks(t, now), []buckets.Field{{Name: "v", Value: buckets.Int(1)}})
	enc.Assign(mustTicks(t, now), attrs("fleet", "East"))
	hdr := nats.Header{wire.Header: []string{wire.Format}}
	e.publishMsg(&nats.Msg{Subject: "telemetry.bin", Data: enc.Append(nil), Header: hdr})

	enc.Reset()
	enc.Add(mustTicks(t, now), []buckets.Field{{Name: "v", Value: buckets.Int(1)}})
	enc.Assign(mustTicks(t, now.Add(24*time.Hour)), attrs("fleet", "Future"))
	last := e.publishMsg(&nats.Msg{Subject: "telemetry.bin-future", Data: enc.Append(nil), Header: hdr})
	e.waitAcked(last)

	assert.Equal(t, map[buckets.DeviceID]map[string]string{"bin": {"fleet": "East"}}, e.w.attributes())
	dl := e.waitDeadLetters(1)
	assert.Equal(t, "rejected.telemetry.bin-future", dl[0].Subject)
	assert.Equal(t, "too_far_in_future", dl[0].Header.Get(topology.HeaderErrorCode))
	assert.Contains(t, dl[0].Header.Get(topology.HeaderError), "attributes")
	assert.Empty(t, e.w.stored("bin-future"))
}

func TestCompactAssignments(t *testing.T) {
	one := []buckets.Assignment{{Device: "a", At: 5, Set: attrs("x", "1")}}
	assert.Equal(t, one, compactAssignments(one))

	got := compactAssignments([]buckets.Assignment{
		{Device: "b", At: 10, Set: attrs("fleet", "East", "model", "F")},
		{Device: "a", At: 7, Set: attrs("fleet", "North")},
		{Device: "b", At: 30, Set: attrs("fleet", "West")},
		{Device: "b", At: 20, Set: attrs("fleet", "South", "site", "s1")}, // late: fleet loses to 30
		{Device: "b", At: 30, Set: attrs("site", "s2")},
		{Device: "a", At: 7, Set: attrs("fleet", "East")}, // equal At: the greater value wins, as in the store
	})
	assert.Equal(t, []buckets.Assignment{
		{Device: "a", At: 7, Set: attrs("fleet", "North")},
		{Device: "b", At: 10, Set: attrs("model", "F")},
		{Device: "b", At: 30, Set: attrs("fleet", "West", "site", "s2")},
	}, got)
}
