package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadmeQuickStart runs the README's quick start as a newcomer
// would, against a service started with the defaults except for its
// addresses and data dir (the test must not take the default ports):
// every command of the block between the quick-start markers runs in
// bash, in order, and must succeed; the addresses in the commands are
// pointed at the test's service. So the quick start cannot drift from
// what the service does.
func TestReadmeQuickStart(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed (.ci/run installs it)")
	}
	script := quickStart(t, docFile(t, "README.md"))

	cfg := newTestConfig(t)
	cfg.LogLevel = "warn"
	s := startService(t, cfg, func(m *Main) { m.now = time.Now })

	// go run ./cmd/X is built once, so the commands run at the speed a
	// newcomer's second run has.
	bin := t.TempDir()
	out, err := exec.Command("go", "build", "-o", bin, "../telemetry-sim").CombinedOutput()
	require.NoError(t, err, "%s", out)
	script = strings.ReplaceAll(script, "go run ./cmd/telemetry-sim", filepath.Join(bin, "telemetry-sim"))
	script = strings.ReplaceAll(script, "http://127.0.0.1:8080", s.base)

	// curl fails on an HTTP error as well as on a connection error; the
	// README's commands use -s so a newcomer sees the error body.
	cmd := exec.Command("bash", "-c", "set -euo pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n"+script)
	cmd.Env = append(os.Environ(), "TELEMETRY_SIM_NATS_URL="+s.NATSURL())
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "the quick start failed:\n%s", out)
	t.Logf("quick start output:\n%s", out)

	// What a newcomer is told to look for is there.
	for _, want := range []string{`"device":"sim-0001"`, `"readings":[`, `"buckets":[`, `"status":"success"`, `"day":`, "telemetry_ingest_readings_total"} {
		assert.Contains(t, string(out), want)
	}
}

// quickStart returns the commands of the README's quick-start block.
func quickStart(t *testing.T, doc string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "<!-- quick start")
	require.True(t, ok, "README has the quick-start marker")
	block, _, ok := strings.Cut(rest, "<!-- end of quick start -->")
	require.True(t, ok, "README has the end-of-quick-start marker")
	_, code, ok := strings.Cut(block, "```sh\n")
	require.True(t, ok, "the quick start is a sh block")
	code, _, ok = strings.Cut(code, "```")
	require.True(t, ok)
	var cmds int
	for _, line := range strings.Split(code, "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			cmds++
		}
	}
	require.Greater(t, cmds, 3, "the quick start has commands")
	return code
}
