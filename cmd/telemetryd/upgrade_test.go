package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/partition"
)

// TestUpgradeFromTheOneStreamKeepsEveryReading starts on a data dir
// and stream of the earlier layout (the one stream TELEMETRY, written
// by the service with -stream-partitions 0, which is that layout): some
// readings already stored, more in the stream and never consumed (the
// service stopped, the server ran on). The service with streams per
// partition stores every one of them exactly once, with the readings
// published after the upgrade and one published both before and after
// (a retry across it), and then deletes the old stream.
func TestUpgradeFromTheOneStreamKeepsEveryReading(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.StreamPartitions = 0
	devices := []string{"up-a", "up-b", "up-c", "up-d", "up-e"}
	s := upgradeRun(t, cfg, devices, upgradeStep{
		streamOf: func(string) string { return "TELEMETRY" },
		held: func(ctx context.Context, js jetstream.JetStream) {
			st, err := js.Stream(ctx, "TELEMETRY")
			require.NoError(t, err)
			require.Equal(t, uint64(50*len(devices)), st.CachedInfo().State.Msgs)
		},
		then: func(cfg *Config) {
			cfg.StreamPartitions = -1 // the default: a stream per partition
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	waitFor(t, 50*time.Millisecond, func() bool {
		_, err := s.js.Stream(ctx, "TELEMETRY")
		return err != nil
	}, "the old stream was not deleted once drained")
	names := readingStreams(t, s.js)
	assert.Len(t, names, DefaultStreamPartitions)
	assert.NotContains(t, names, "TELEMETRY")
	for _, d := range devices {
		st, err := s.js.Stream(ctx, streamOf(d))
		require.NoError(t, err)
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(storedSubject(d)))
		require.NoError(t, err)
		assert.Equal(t, uint64(11), info.State.Subjects[storedSubject(d)], "device %s: its publishes after the upgrade in its partition's stream", d)
	}
	rej, err := s.js.Stream(ctx, "TELEMETRY_REJECTED")
	if err == nil {
		assert.Zero(t, rej.CachedInfo().State.Msgs, "nothing dead-lettered")
	}
}

// TestBackupRestoreAcrossTheUpgrade: a backup taken online in the
// earlier layout (the one stream, on an external server), readings
// acked after it, then the server maps publishes to partitions and the
// backup is restored into a fresh data dir for a service with streams
// per partition. It resumes the old stream after the backup's position,
// drains it and deletes it, stores what is published after the
// upgrade, and has every acked reading exactly once.
func TestBackupRestoreAcrossTheUpgrade(t *testing.T) {
	inLane(t, lanes.general)
	devices := []string{"xb-a", "xb-b", "xb-c"}
	b := backupWhilePublishing(t, "before-upgrade", devices)
	js := b.js

	src, dst := partition.Mapping("telemetry", DefaultStreamPartitions)
	require.NoError(t, b.ns.GlobalAccount().AddMapping(src, dst))
	dataDir, _ := restoreBackup(t, b.dir)
	cfg2 := b.cfg
	cfg2.DataDir, cfg2.StreamPartitions = dataDir, DefaultStreamPartitions
	s2 := startService(t, cfg2)
	t.Cleanup(func() { s2.stop(t) })

	after := map[string]string{}
	for i, d := range devices {
		ts := testEpoch.Add(-30*time.Minute + time.Duration(i)*time.Second).Format(time.RFC3339Nano)
		ack, err := js.Publish(context.Background(), "telemetry."+d, []byte(fmt.Sprintf(`{"ts":%q,"v":-1}`, ts)))
		require.NoError(t, err)
		require.Equal(t, streamOf(d), ack.Stream, "published after the upgrade into the partition's stream")
		after[d] = ts
	}
	waitFor(t, 50*time.Millisecond, func() bool {
		_, err := js.Stream(context.Background(), "TELEMETRY")
		return errors.Is(err, jetstream.ErrStreamNotFound)
	}, "the one stream was not drained and deleted")

	for _, d := range devices {
		requireEachOnce(t, s2, d, append(slices.Clone(b.acked.ts[d]), after[d]))
	}
}

// upgradeStep says how a layout upgrade differs between the tests that
// drive it through upgradeRun.
type upgradeStep struct {
	// mapping: the bare server maps publishes to partitions, as the
	// service with streams per partition has its server do.
	mapping bool
	// streamOf is the stream expected to ack a device's publish on the
	// bare server.
	streamOf func(device string) string
	// held, when set, checks what the streams hold before the upgrade.
	held func(ctx context.Context, js jetstream.JetStream)
	// then changes the configuration into the new layout's.
	then func(*Config)
}

// upgradeRun drives a layout upgrade: the service in the earlier layout
// (cfg) stores 20 readings a device and stops; a bare server on its
// data dir acks 30 more a device that no consumer takes; then the
// service in the new layout takes 11 more, the first a retry of the
// last one before, and must hold every reading of each device exactly
// once, in order. It returns that service for the checks of the layout.
func upgradeRun(t *testing.T, cfg Config, devices []string, step upgradeStep) *testService {
	t.Helper()
	at := func(i int) string {
		return testEpoch.Add(-time.Hour + time.Duration(i)*time.Second).Format(time.RFC3339Nano)
	}
	payload := func(i int) string { return fmt.Sprintf(`{"ts":%q,"v":%d}`, at(i), i) }

	old := startService(t, cfg)
	for i := range 20 {
		for _, d := range devices {
			old.publish(t, d, payload(i))
		}
	}
	for _, d := range devices {
		waitStored(t, old, d, 20)
	}
	old.stop(t)

	// Readings the streams hold and no consumer took yet.
	ns, err := server.NewServer(&server.Options{ServerName: "telemetryd", Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: filepath.Join(cfg.DataDir, "nats"), NoSigs: true})
	require.NoError(t, err)
	if step.mapping {
		src, dst := partition.Mapping("telemetry", DefaultStreamPartitions)
		require.NoError(t, ns.GlobalAccount().AddMapping(src, dst))
	}
	ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 20; i < 50; i++ {
		for _, d := range devices {
			ack, err := js.Publish(ctx, "telemetry."+d, []byte(payload(i)))
			require.NoError(t, err)
			require.Equal(t, step.streamOf(d), ack.Stream)
		}
	}
	if step.held != nil {
		step.held(ctx, js)
	}
	nc.Close()
	ns.Shutdown()
	ns.WaitForShutdown()

	step.then(&cfg)
	s := startService(t, cfg)
	for i := 49; i < 60; i++ { // 49 again: a retry across the upgrade
		for _, d := range devices {
			s.publish(t, d, payload(i))
		}
	}
	requireValuesInOrder(t, s, devices, 60)
	return s
}

// requireValuesInOrder waits until s holds n readings of each device,
// then asserts they are the values 0 to n-1 in time order, each once.
func requireValuesInOrder(t *testing.T, s *testService, devices []string, n int) {
	t.Helper()
	for _, d := range devices {
		waitStored(t, s, d, n)
		got := pageAll(t, s, d, "asc", 1000, url.Values{})
		require.Len(t, got, n, "device %s: every reading once", d)
		for i, r := range got {
			assert.Equal(t, float64(i), r.Values["v"], "device %s reading %d", d, i)
		}
	}
}
