package main

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// TestUpgradeToTheIntakeKeepsEveryReading starts with -sync-writes on
// a data dir whose partition streams capture the devices' subjects
// (written without the intake, as earlier versions did): some readings
// stored, more in the streams and never consumed (the service stopped,
// the server ran on). With the intake every one of them is stored
// exactly once, with the readings published after the upgrade and one
// published both before and after (a retry across it); the streams then
// capture the intake's subjects only, so no publish has two responders.
func TestUpgradeToTheIntakeKeepsEveryReading(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.SyncWrites, cfg.Intake = true, false
	devices := []string{"in-a", "in-b", "in-c", "in-d", "in-e"}
	s := upgradeRun(t, cfg, devices, upgradeStep{
		mapping:  true,
		streamOf: streamOf,
		then: func(cfg *Config) {
			cfg.Intake = true
		},
	})
	require.NotNil(t, s.intake, "the intake runs")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for p := range DefaultStreamPartitions {
		st, err := s.js.Stream(ctx, partition.Stream("TELEMETRY", p))
		require.NoError(t, err)
		subjects := st.CachedInfo().Config.Subjects
		assert.NotContains(t, subjects, partition.Subjects("telemetry", p), "partition %d: devices' subjects no longer captured", p)
		assert.Contains(t, subjects, ingest.IntakeSubject("telemetry", p, "*"))
	}
	for _, d := range devices {
		st, err := s.js.Stream(ctx, streamOf(d))
		require.NoError(t, err)
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(storedSubject(d)))
		require.NoError(t, err)
		assert.Equal(t, uint64(20+30+11), info.State.Subjects[storedSubject(d)],
			"device %s: each publish one message under the subject it had before", d)
	}
	assert.Positive(t, s.intake.Stats().Batches+s.intake.Stats().Passed, "the intake took the publishes")
}

// TestIntakeTakesEveryDoor: with -sync-writes the service answers
// NATS publishes (nats.go's Publish and PublishAsync, message IDs
// included) itself, MQTT QoS 1 PUBACKs follow the store of their copy,
// QoS 0 is forwarded through the intake and line protocol writes go to
// the intake's subjects; every reading is stored once.
func TestIntakeTakesEveryDoor(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.SyncWrites = true
	s := startService(t, cfg)
	require.NotNil(t, s.intake)
	first := testEpoch.Add(-time.Hour)
	ts := func(i int) string { return first.Add(time.Duration(i) * time.Second).Format(time.RFC3339Nano) }
	const n = 40

	var futs []jetstream.PubAckFuture
	for i := range n {
		for d := range 10 {
			m := &nats.Msg{Subject: "telemetry.nats-" + strconv.Itoa(d), Data: fmt.Appendf(nil, `{"ts":%q,"v":%d}`, ts(i), i),
				Header: nats.Header{"Nats-Msg-Id": []string{"id-" + strconv.Itoa(i)}}}
			f, err := s.js.PublishMsgAsync(m)
			require.NoError(t, err)
			futs = append(futs, f)
		}
	}
	for _, f := range futs {
		select {
		case ack := <-f.Ok():
			dev := f.Msg().Subject[len("telemetry."):]
			assert.Equal(t, streamOf(dev), ack.Stream)
		case err := <-f.Err():
			t.Fatal(err)
		case <-time.After(30 * time.Second):
			t.Fatal("publish not acked")
		}
	}
	c := newMQTTClient(t, s, "intake-doors")
	for i := range n {
		for qos := byte(0); qos <= 1; qos++ {
			tok := c.Publish("telemetry/mqtt-q"+strconv.Itoa(int(qos)), qos, false, fmt.Sprintf(`{"ts":%q,"v":%d}`, ts(i), i))
			require.True(t, tok.WaitTimeout(10*time.Second))
			require.NoError(t, tok.Error())
		}
	}
	var lines []byte
	for i := range n {
		lines = fmt.Appendf(lines, "m,device=lp-1 v=%di %d\nm,device=lp-2 v=%di %d\n", i, first.Add(time.Duration(i)*time.Second).UnixNano(),
			i, first.Add(time.Duration(i)*time.Second).UnixNano())
	}
	code, body := s.post(t, "/api/v2/write", lines, nil)
	require.Equal(t, 204, code, body)

	devices := []string{"mqtt-q0", "mqtt-q1", "lp-1", "lp-2"}
	for d := range 10 {
		devices = append(devices, "nats-"+strconv.Itoa(d))
	}
	for _, d := range devices {
		waitStored(t, s, d, n)
		got := pageAll(t, s, d, "asc", 1000, url.Values{})
		require.Len(t, got, n, "device %s", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stored uint64
	for p := range DefaultStreamPartitions {
		st, err := s.js.Stream(ctx, partition.Stream("TELEMETRY", p))
		require.NoError(t, err)
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(">"))
		require.NoError(t, err)
		for subj, k := range info.State.Subjects {
			assert.True(t, slices.Contains([]string{"telemetry." + strconv.Itoa(p) + "._lines"}, subj) || partition.DeviceToken("telemetry", subj) != "",
				"stored under a reader's subject: %s", subj)
			stored += k
		}
	}
	// 10 NATS devices and 2 MQTT ones, a message per reading; the line
	// protocol write one message per partition it touched.
	lp := map[int]bool{partition.Of(DefaultStreamPartitions, "lp-1"): true, partition.Of(DefaultStreamPartitions, "lp-2"): true}
	assert.Equal(t, uint64(12*n+len(lp)), stored, "each publish stored once")
}
