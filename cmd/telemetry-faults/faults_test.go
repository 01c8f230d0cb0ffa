package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain lets the test binary serve as the harness's NATS servers, as
// the harness binary does (natsConfigEnv).
func TestMain(m *testing.M) {
	if path := os.Getenv(natsConfigEnv); path != "" {
		if err := runNATSServer(path); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// faultTestConfig skips unless TELEMETRY_FAULTS=1 (the fault tests are
// off by default for now) and this machine can make network namespaces, and returns a run's configuration with a
// telemetryd built for it.
func faultTestConfig(t *testing.T) Config {
	t.Helper()
	if os.Getenv("TELEMETRY_FAULTS") != "1" {
		t.Skip("the fault harness runs only with TELEMETRY_FAULTS=1 (it needs root for network namespaces, iptables and tc)")
	}
	if os.Geteuid() != 0 {
		t.Skip("the fault harness needs root (network namespaces, iptables, tc)")
	}
	if err := canMakeNamespaces(context.Background()); err != nil {
		t.Skipf("the fault harness cannot run here: %v", err)
	}
	bin, err := buildService(context.Background(), t.TempDir())
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.Binary, cfg.Seed = bin, 4040 // the run keeps its logs in the temp dir when it fails
	cfg.LazyFS = os.Getenv("TELEMETRY_LAZYFS")
	return cfg
}

func runFaults(t *testing.T, cfg Config) Result {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	res, err := Run(t.Context(), cfg, log)
	var out bytes.Buffer
	printResult(&out, cfg, res)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	return res
}

// TestFaultsClusterUp: three NATS servers and three nodes, each in its
// own namespace, take readings and store each acked one on both owners
// of its partition; afterwards no namespace or bridge of the run is
// left.
func TestFaultsClusterUp(t *testing.T) {
	cfg := faultTestConfig(t)
	before := harnessNamespaces()
	cfg.Faults = 0
	cfg.Settle = 10 * time.Second
	res := runFaults(t, cfg)
	assert.True(t, res.OK(), "no violation")
	assert.Positive(t, res.Acked)
	assert.Equal(t, cfg.Devices*cfg.Copies, res.Checked, "every device read from each owner")
	assert.Empty(t, res.badQueries())
	assert.NotEmpty(t, res.Queries)
	leftNamespaces(t, before)
}

// TestFaultsShort is the short run: about four minutes of faults, every
// fault kind twice, and every check passing. With TELEMETRY_LAZYFS every
// disk is a LazyFS mount and the power cuts of one machine and of all
// three join the kinds, each kind once (a power cut of all three takes
// a minute or two), at a lower rate (LazyFS's fsyncs cost a round trip
// through its daemon each). For now it runs only with
// TELEMETRY_FAULTS=1 (see faultTestConfig), until it has passed
// repeatedly; it needs root.
func TestFaultsShort(t *testing.T) {
	cfg := faultTestConfig(t)
	before := harnessNamespaces()
	cfg.Faults = 2 * len(faultKinds(cfg))
	if cfg.LazyFS != "" {
		cfg.Faults, cfg.Rate = len(faultKinds(cfg)), lazyFSRate
	}
	cfg.Gap = 3 * time.Second
	res := runFaults(t, cfg)
	assert.True(t, res.OK(), "no violation")
	seen := map[string]bool{}
	scheduled := 0
	for _, f := range res.Faults {
		seen[f.Kind] = true
		if f.Kind != faultDiskExit {
			scheduled++
		}
	}
	require.Equal(t, cfg.Faults, scheduled, "faults injected (besides LazyFS exits)")
	for _, k := range faultKinds(cfg) {
		assert.True(t, seen[k], "fault kind %s injected", k)
	}
	leftNamespaces(t, before)
}

// leftNamespaces fails when a namespace of the run that just ended is
// still there: one not among before, the harness's namespaces when the
// test started (a run killed earlier may have left its own).
func leftNamespaces(t *testing.T, before []string) {
	t.Helper()
	now := harnessNamespaces()
	assert.Empty(t, slices.DeleteFunc(now, func(ns string) bool { return slices.Contains(before, ns) }),
		"namespaces left behind")
}

// harnessNamespaces lists the network namespaces of the harness's runs.
func harnessNamespaces() []string {
	ns, _ := filepath.Glob("/run/netns/tf-*")
	return ns
}
