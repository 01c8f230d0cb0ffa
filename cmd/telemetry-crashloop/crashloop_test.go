package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
