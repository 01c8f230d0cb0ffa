package testhook

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/store"
)

// The test fault point stops the process once, at the point asked for,
// only after its arm file appeared; without the variables there is no
// hook, and a wrong point is refused.
func TestFaultPointFromEnv(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	log := slog.New(slog.DiscardHandler)

	hook, err := FaultPoint(env(nil), log)
	require.NoError(t, err)
	assert.Nil(t, hook, "unset: no hook")
	_, err = FaultPoint(env(map[string]string{envCutAt: "mid-commit", envCutArm: "x"}), log)
	assert.ErrorContains(t, err, envCutAt)
	_, err = FaultPoint(env(map[string]string{envCutAt: "after-commit"}), log)
	assert.ErrorContains(t, err, envCutArm)

	arm := filepath.Join(t.TempDir(), "arm")
	kills := 0
	hook, err = faultHook(env(map[string]string{envCutAt: "after-commit", envCutArm: arm}), log, func() { kills++ })
	require.NoError(t, err)
	hook(store.AfterCommit)
	assert.Zero(t, kills, "not armed yet")
	require.NoError(t, os.WriteFile(arm, nil, 0o644))
	time.Sleep(2 * cutArmCheck)
	hook(store.BeforeCommit)
	assert.Zero(t, kills, "another point")
	hook(store.AfterCommit)
	hook(store.AfterCommit)
	assert.Equal(t, 1, kills, "once, at its point")
}
