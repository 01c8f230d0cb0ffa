package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	dir, err := os.MkdirTemp("", "telemetry-faults-bin-")
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	buildDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// faultTestConfig skips, saying what is missing, unless this machine
// can run the harness (root, network namespaces, iptables, tc), and
// returns a run's configuration with a telemetryd built for it (once
// per test binary). TELEMETRY_FAULTS=0 skips the fault tests; with
// TELEMETRY_LAZYFS naming the lazyfs binary the runs put every disk on
// LazyFS and add the power cuts.
func faultTestConfig(t *testing.T) Config {
	t.Helper()
	if os.Getenv("TELEMETRY_FAULTS") == "0" {
		t.Skip("fault tests off (TELEMETRY_FAULTS=0)")
	}
	if testing.Short() {
		t.Skip("fault tests take minutes; not with -short")
	}
	if err := harnessCanRun(t.Context()); err != nil {
		t.Skipf("the fault harness cannot run here: %v", err)
	}
	buildOnce.Do(func() { serviceBin, buildErr = buildService(context.Background(), buildDir) })
	require.NoError(t, buildErr)
	cfg := DefaultConfig()
	cfg.Binary, cfg.Seed = serviceBin, 4040 // the run keeps its logs in the temp dir when it fails
	cfg.WorkDir = t.TempDir()
	cfg.LazyFS = os.Getenv("TELEMETRY_LAZYFS")
	if cfg.LazyFS == "" {
		t.Log("no power cuts: TELEMETRY_LAZYFS does not name a lazyfs binary (built from source, cmd/telemetry-crashloop/README.md); " +
			"crashes (SIGKILL of one machine's processes, of every machine's) take their place and lose no write the kernel holds")
	}
	return cfg
}

// harnessCanRun says what keeps the harness from running here: not
// root, a command missing, or network namespaces that cannot be made.
func harnessCanRun(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("not root (network namespaces, iptables and tc need it)")
	}
	var missing []string
	for _, c := range []struct{ cmd, pkg string }{{"ip", "iproute2"}, {"tc", "iproute2"}, {"iptables", "iptables"}} {
		if _, err := exec.LookPath(c.cmd); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian package %s)", c.cmd, c.pkg))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing commands: %s", strings.Join(missing, ", "))
	}
	if err := canMakeNamespaces(ctx); err != nil {
		return err
	}
	// iptables needs its kernel tables (a container may lack them).
	if out, err := exec.CommandContext(ctx, "iptables", "-w", "-L", "-n").CombinedOutput(); err != nil {
		return fmt.Errorf("iptables -L does not work: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

var (
	buildOnce  sync.Once
	serviceBin string
	buildErr   error
	buildDir   string // set by TestMain, removed after the tests
)

func runFaults(t *testing.T, cfg Config) Result {
	t.Helper()
	res, _ := runFaultsOut(t, cfg)
	return res
}

// runFaultsOut runs cfg and returns its result and its printed output.
func runFaultsOut(t *testing.T, cfg Config) (Result, string) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	res, err := Run(t.Context(), cfg, log)
	var out bytes.Buffer
	printResult(&out, cfg, res)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	return res, out.String()
}

// TestFaultsClusterUp: three NATS servers and three nodes, each in its
// own namespace, take readings and store each acked one on both owners
// of its partition; afterwards no namespace or bridge of the run is
// left. Its one fault fails after it was healed (as a process that does
// not exit after SIGKILL fails a power cut): the run records it, goes
// on, makes every check and prints them, and fails on the fault alone.
func TestFaultsClusterUp(t *testing.T) {
	cfg := faultTestConfig(t)
	before := harnessLeftovers(cfg.WorkDir)
	cfg.Faults, cfg.Gap = 2, time.Second
	cfg.failFault = func(n int, f *fault) error {
		if n == 1 {
			return errors.New("node-9 did not exit within 1m0s of SIGKILL")
		}
		return nil
	}
	cfg.Settle = 10 * time.Second
	res, out := runFaultsOut(t, cfg)
	assert.False(t, res.OK(), "a failed fault fails the run")
	require.Len(t, res.Faults, 2, "the schedule went on after the failed fault")
	assert.Contains(t, res.Faults[0].Err, "did not exit")
	assert.Contains(t, res.Faults[0].What, "recovered")
	assert.Empty(t, res.Faults[1].Err)
	assert.Positive(t, res.Acked)
	assert.Equal(t, cfg.Devices*cfg.Copies, res.Checked, "every device read from each owner")
	assert.Zero(t, res.Unchecked)
	assert.Zero(t, res.Lost+res.Duplicated+res.Misattributed+res.Unexpected)
	assert.Empty(t, res.Incomplete)
	assert.Empty(t, res.badQueries())
	assert.NotEmpty(t, res.Queries)
	assert.Empty(t, res.DoubleServed)
	for _, line := range []string{"faults failed: 1", "check stored: owner_copies_read=48 unchecked=0 lost=0", "check queries:", "check double serving: 0", "incomplete: 0", "FAIL"} {
		assert.Contains(t, out, line)
	}
	noLeftovers(t, cfg.WorkDir, before)
}

// TestFaultsSetUpCancelled stops runs (as ctrl-C or SIGTERM does) at
// points along their set-up: making the network, mounting LazyFS (with
// TELEMETRY_LAZYFS), starting the NATS servers and the nodes. None may
// leave a namespace, a bridge, a mount or a process behind.
func TestFaultsSetUpCancelled(t *testing.T) {
	cfg := faultTestConfig(t)
	cfg.WorkDir = t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, after := range []time.Duration{0, 20 * time.Millisecond, 80 * time.Millisecond, 250 * time.Millisecond,
		700 * time.Millisecond, 2 * time.Second, 5 * time.Second} {
		before := harnessLeftovers(cfg.WorkDir)
		ctx, cancel := context.WithTimeout(t.Context(), after)
		began := time.Now()
		_, err := Run(ctx, cfg, log)
		cancel()
		t.Logf("cancelled after %s: Run returned after %s", after, time.Since(began).Round(time.Millisecond))
		require.Error(t, err, "cancelled after %s", after)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "cancelled after %s", after)
		noLeftovers(t, cfg.WorkDir, before)
		assert.Empty(t, processesUnder(cfg.WorkDir), "processes left after a cancel at %s", after)
	}
}

// TestFaultsShort is the short run, in go test wherever the harness
// can run (faultTestConfig skips naming what is missing): one fault of
// each kind, every check passing, in about three minutes. Without
// TELEMETRY_LAZYFS the power cuts are crashes (faultKinds); with it
// every disk is a LazyFS mount, a cut of one machine and of all three
// drop every unsynced write, and the rate is lower (LazyFS's fsyncs
// cost a round trip through its daemon each), which makes the run
// longer (a cut of all three takes a minute or two).
func TestFaultsShort(t *testing.T) {
	cfg := faultTestConfig(t)
	before := harnessLeftovers(cfg.WorkDir)
	cfg.Faults, cfg.Gap = len(faultKinds(cfg)), 2*time.Second
	if cfg.LazyFS != "" {
		cfg.Rate = lazyFSRate
	}
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
	noLeftovers(t, cfg.WorkDir, before)
}

// noLeftovers fails when a namespace, bridge or LazyFS mount of the
// harness is there that was not among before (harnessLeftovers when the
// run started: a run killed earlier may have left its own). Mounts
// count only under dir, the run's work dir: another run on the machine
// mounts its disks again at every power cut.
// The kernel removes a deleted namespace's links a while after (the
// namespace is freed in the background): noLeftovers waits for that.
func noLeftovers(t *testing.T, dir string, before []string) {
	t.Helper()
	left := func() []string {
		return slices.DeleteFunc(harnessLeftovers(dir), func(x string) bool { return slices.Contains(before, x) })
	}
	for deadline := time.Now().Add(2 * time.Minute); len(left()) > 0 && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
	}
	assert.Empty(t, left(), "namespaces, bridges or mounts left behind")
}

// harnessLeftovers lists the harness's network namespaces and bridges,
// and the LazyFS mounts under dir.
func harnessLeftovers(dir string) []string {
	out, _ := filepath.Glob("/run/netns/tf-*")
	links, _ := net.Interfaces()
	for _, l := range links {
		if strings.HasPrefix(l.Name, "tfb") || strings.HasPrefix(l.Name, "tfv") {
			out = append(out, "link "+l.Name)
		}
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if strings.Contains(line, "fuse.lazyfs") && len(f) > 4 && strings.HasPrefix(f[4], dir+string(filepath.Separator)) {
			out = append(out, "mount "+f[4])
		}
	}
	return out
}

// processesUnder lists the processes whose command line or environment
// names a path under dir: the run's NATS servers (their configuration),
// nodes (their data dirs) and LazyFS processes.
func processesUnder(dir string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		for _, f := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(filepath.Join(p, f))
			if err == nil && bytes.Contains(b, []byte(dir)) {
				out = append(out, p+": "+strings.ReplaceAll(string(b[:min(len(b), 200)]), "\x00", " "))
				break
			}
		}
	}
	return out
}
