package main

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// TestLostInStreams checks where the report places the messages of
// lost readings: one still in the stream below the store's saved
// position (the store's loss), and, for those in no stream, what sits
// at the sequence their ack named: another message (the stream lost
// it and gave its sequence again), nothing, or the stream's end; and
// the dead letters, one of them a lost message's.
func TestLostInStreams(t *testing.T) {
	_, js := ingesttest.JetStream(t)
	ctx := t.Context()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TELEMETRY_0", Subjects: []string{"t.>"}})
	require.NoError(t, err)
	// The stream after the cuts: seq 1 crash-0, 2 crash-9 (crash-1 was
	// acked there, then lost), 3 deleted (crash-2 was acked there), 4
	// crash-3 (lost by the store), and it ends at 4 (crash-4 was acked at 6).
	for _, m := range []int{0, 9, 7, 3} {
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: "t.x", Header: nats.Header{jetstream.MsgIDHeader: {msgID(m)}}, Data: []byte("x")})
		require.NoError(t, err)
	}
	require.NoError(t, s.DeleteMsg(ctx, 3))
	// crash-3 (device 3, seq 4) was dead-lettered, as was another one.
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "TELEMETRY_REJECTED", Subjects: []string{"rejected.>"}})
	require.NoError(t, err)
	for _, dl := range [][2]string{{deviceName(3), "4"}, {deviceName(5), "9"}} {
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: "rejected.telemetry." + dl[0], Data: []byte("x"),
			Header: nats.Header{topology.HeaderErrorCode: {"max_deliveries"}, topology.HeaderStreamSeq: {dl[1]}}})
		require.NoError(t, err)
	}

	pub := &publisher{cfg: Config{Batch: 1, Devices: 10}}
	for m, seq := range map[int]uint64{1: 2, 2: 3, 3: 4, 4: 6} {
		pub.ackedSeqs.noteMsg(m, "TELEMETRY_0", seq)
	}
	res := &Result{LostSeqs: []int{1, 2, 3, 4}, LostCuts: []int{1, 1, 2, 2}}
	out := lostInStreams(ctx, js, pub, res, func() (map[string]uint64, error) {
		return map[string]uint64{"TELEMETRY_0": 4}, nil
	})
	require.NoError(t, out.Err)
	t.Log(out)
	assert.Equal(t, 4, out.Messages)
	assert.Equal(t, 1, out.InStream, "crash-3")
	assert.Equal(t, 1, out.PastPosition, "crash-3 at seq 4, the store's position 4")
	assert.Equal(t, map[seqFate]int{fateReused: 1, fateGone: 1, fatePastEnd: 1}, out.AtAckedSeq)
	assert.Equal(t, map[int][2]int{1: {0, 2}, 2: {1, 1}}, out.ByCut)
	assert.Equal(t, map[string]int{"max_deliveries": 2}, out.DeadLetters)
	assert.Equal(t, map[string]int{"max_deliveries": 1}, out.DeadLettered, "crash-3")
	assert.Contains(t, out.String(), strconv.Quote(msgID(9)), "the message that took crash-1's sequence is named")
}

// TestRegressed: a consumer whose ack floor after a restart is below
// the one after the start before is reported; one that held or moved
// on, or was not there before, is not.
func TestRegressed(t *testing.T) {
	before := map[string][2]uint64{"TELEMETRY_0/ingest": {700, 0}, "TELEMETRY_1/ingest": {650, 0}}
	after := map[string][2]uint64{"TELEMETRY_0/ingest": {0, 700}, "TELEMETRY_1/ingest": {650, 0}, "TELEMETRY_2/ingest": {3, 0}}
	got := regressed(7, before, after)
	require.Len(t, got, 1)
	assert.Equal(t, ConsumerRegress{Cut: 7, Stream: "TELEMETRY_0/ingest", Before: 700, After: 0, Redelivs: 700}, got[0])
	assert.Contains(t, got[0].String(), "ack floor 700 after the start before, 0 after the restart")
}
