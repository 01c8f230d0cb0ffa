package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/auth"
)

// TestShortCrashLoop SIGKILLs a real telemetryd process three times
// while readings are published, then checks every acked reading is
// stored exactly once. The long run is the command in the README.
func TestShortCrashLoop(t *testing.T) {
	cfg := Config{Kills: 3, Readings: 20000, Devices: 10, Batch: 10, Rate: 10000,
		MinUp: 300 * time.Millisecond, MaxUp: 1200 * time.Millisecond, Seed: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	t.Logf("kills=%d acked=%d stored=%d lost=%d duplicated=%d unexpected=%d", res.Kills, res.Published, res.Stored, res.Lost, res.Duplicated, res.Unexpected)
	require.NoError(t, err)
	assert.Equal(t, 3, res.Kills)
	assert.Equal(t, cfg.Readings, res.Published)
	assert.Equal(t, cfg.Readings, res.Stored)
	assert.Zero(t, res.Lost)
	assert.Zero(t, res.Duplicated)
	assert.Zero(t, res.Unexpected)
	require.Len(t, res.Cuts, 3, "every kill is recorded")
	for i, c := range res.Cuts {
		assert.False(t, c.At.IsZero(), "kill %d has its time", i)
	}
	t.Logf("kills while publishes were in flight: %d of %d", res.cutsInFlight(), len(res.Cuts))
}

// TestLossBound: with a loss bound, lost readings pass only when each
// was acked within the bound before its cut; without one, none may be
// lost; and a failed start fails the run.
func TestLossBound(t *testing.T) {
	ok := Result{Published: 10, Stored: 8, Lost: 2, LossBound: 2 * time.Second,
		LostAges: []time.Duration{time.Second, 2 * time.Second}}
	assert.True(t, ok.OK())
	old := ok
	old.LostAges = []time.Duration{time.Second, 2*time.Second + time.Millisecond}
	assert.False(t, old.OK(), "a reading acked longer than the bound before its cut")
	noCut := ok
	noCut.LostAges = []time.Duration{time.Second, -1}
	assert.False(t, noCut.OK(), "a reading lost without a cut after its ack")
	strict := ok
	strict.LossBound = 0
	assert.False(t, strict.OK(), "no bound: nothing may be lost")
	clean := Result{Published: 10, Stored: 10}
	assert.True(t, clean.OK())
	clean.FailedStarts = 1
	assert.False(t, clean.OK(), "a failed start fails the run")

	r := Result{Cuts: []cut{{InFlight: 3}, {InFlight: 0}, {InFlight: 1}}}
	assert.Equal(t, 2, r.cutsInFlight())

	by := Result{LostAges: []time.Duration{time.Second, 3 * time.Second, 2 * time.Second, -1}, LostCuts: []int{2, 1, 2, 0}}
	assert.Equal(t, []cutLoss{{cut: 0, lost: 1, oldest: -1}, {cut: 1, lost: 1, oldest: 3 * time.Second},
		{cut: 2, lost: 2, oldest: 2 * time.Second}}, by.lossByCut(), "the lost readings by the cut that took them")
}

// TestShortCrashLoopMQTT is the same with MQTT QoS 1 publishes: every
// PUBACKed reading is stored exactly once.
func TestShortCrashLoopMQTT(t *testing.T) {
	cfg := Config{Kills: 3, Readings: 20000, Devices: 10, Batch: 10, Rate: 10000, Protocol: "mqtt",
		MinUp: 300 * time.Millisecond, MaxUp: 1200 * time.Millisecond, Seed: 2}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	t.Logf("kills=%d acked=%d stored=%d lost=%d duplicated=%d unexpected=%d", res.Kills, res.Published, res.Stored, res.Lost, res.Duplicated, res.Unexpected)
	require.NoError(t, err)
	assert.Equal(t, 3, res.Kills)
	assert.Equal(t, cfg.Readings, res.Published)
	assert.Equal(t, cfg.Readings, res.Stored)
	assert.Zero(t, res.Lost)
	assert.Zero(t, res.Duplicated)
	assert.Zero(t, res.Unexpected)
	require.Len(t, res.Cuts, 3, "every kill is recorded")
	for i, c := range res.Cuts {
		assert.False(t, c.At.IsZero(), "kill %d has its time", i)
	}
	t.Logf("kills while publishes were in flight: %d of %d", res.cutsInFlight(), len(res.Cuts))
}

// TestHostileCrashLoop is -hostile in short: while the loop publishes
// and the service is killed three times, a second device takes the
// Nats-Msg-Id of the loop's next messages, floods a 64MiB stream with
// invalid payloads of megabytes and rewrites the auth file every
// second; every acked reading must still be stored exactly once, and
// the QoS 0 probe's readings too. It runs only with
// TELEMETRY_CRASHLOOP_HOSTILE=1 (a service that shares its duplicate
// window between devices, discards old messages when its stream is
// full, or drops its own connections on an auth reload fails it).
func TestHostileCrashLoop(t *testing.T) {
	if os.Getenv("TELEMETRY_CRASHLOOP_HOSTILE") != "1" {
		t.Skip("set TELEMETRY_CRASHLOOP_HOSTILE=1 to run the crash loop with a hostile client")
	}
	cfg := Config{Kills: 3, Readings: 20000, Devices: 10, Batch: 10, Rate: 5000, Hostile: true,
		MinUp: 300 * time.Millisecond, MaxUp: 1200 * time.Millisecond, Seed: 3, StallTimeout: time.Minute}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	t.Logf("kills=%d acked=%d stored=%d lost=%d duplicated=%d unexpected=%d unacked=%d lost_acked_duplicate=%d",
		res.Kills, res.Published, res.Stored, res.Lost, res.Duplicated, res.Unexpected, res.Unacked, res.LostAckedDuplicate)
	require.NotNil(t, res.Hostile)
	t.Logf("hostile: %s", res.Hostile)
	if res.Probe != nil {
		t.Logf("qos0 probe: %s", res.Probe)
	}
	require.NoError(t, err)
	assert.Equal(t, cfg.Readings, res.Published)
	assert.Equal(t, cfg.Readings, res.Stored)
	assert.Zero(t, res.Lost)
	assert.Zero(t, res.Duplicated)
	assert.Zero(t, res.Unexpected)
	require.NotNil(t, res.Probe)
	assert.Empty(t, res.Probe.Unchecked)
	assert.Zero(t, res.Probe.Lost)
	// The attack happened.
	assert.Positive(t, res.Hostile.CopiesSent.Load())
	assert.Positive(t, res.Hostile.FloodAcked.Load()+res.Hostile.FloodRefused.Load())
	assert.Positive(t, res.Hostile.AuthReloads.Load())
}

// TestRewriteChurn checks the hostile client's auth file rewrite: every
// rewrite changes the file (so the service reloads it) and keeps the
// run's credentials.
func TestRewriteChurn(t *testing.T) {
	creds, err := writeCredentials(t.TempDir(), []string{"crash-000", probeDevice})
	require.NoError(t, err)
	before, err := os.ReadFile(creds.file)
	require.NoError(t, err)
	for range 2 {
		require.NoError(t, rewriteChurn(creds.file))
		after, err := os.ReadFile(creds.file)
		require.NoError(t, err)
		assert.NotEqual(t, string(before), string(after), "a rewrite must change the file")
		before = after
	}
	f, err := auth.Load(creds.file)
	require.NoError(t, err)
	set := auth.Compile(f)
	assert.True(t, set.Device(loopGateway, creds.loopSecret))
	assert.ElementsMatch(t, []string{"crash-000", probeDevice}, set.PublishAs(loopGateway))
	assert.True(t, set.Device(hostileDevice, creds.hostileSecret))
	assert.Empty(t, set.PublishAs(hostileDevice))
	p, ok := set.Token(creds.readToken)
	require.True(t, ok)
	assert.True(t, p.Has(auth.ScopeRead))
	matches, err := filepath.Glob(filepath.Join(filepath.Dir(creds.file), ".*tmp*"))
	require.NoError(t, err)
	assert.Empty(t, matches, "no temporary files left behind")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
