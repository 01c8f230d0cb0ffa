package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shellDocs are the pages whose shell blocks TestReadmeQuickStart runs:
// the README first (its install step puts telemetryd on PATH), then
// the pages it links.
var shellDocs = []string{
	"README.md",
	"SECURITY.md",
	"ingest/README.md",
	"api/README.md",
	"api/FLEET-QUERIES.md",
	"store/README.md",
	"retention/README.md",
	"deploy/README.md",
	"deploy/CLUSTER.md",
	"cmd/telemetryd/CONFIGURATION.md",
	"cmd/telemetryd/OPERATIONS.md",
	"cmd/telemetry-bench/README.md",
	"cmd/telemetry-crashloop/README.md",
	"BENCHMARKS.md",
}

// The first line of a shell block may say how the doc test treats it,
// visibly to readers: notRun (with the reason) skips it, stopped runs it
// after every other block, with the service stopped.
const (
	notRun  = "# not run by the doc test: "
	stopped = "# with the service stopped:"
)

// shellBlock is one ```sh block of a page.
type shellBlock struct {
	page    string
	line    int
	code    string
	stopped bool
}

// TestReadmeQuickStart follows the documentation as a newcomer would:
// every ```sh block of the README and of the pages it links runs in
// bash, in order, against a service started here, and must succeed
// (curl fails on an HTTP error). The README's install step runs for
// real (deploy/install.sh into a temporary GOBIN, with
// GOFLAGS=-buildvcs=false, so the commit comes from -ldflags) and puts
// telemetryd on PATH for the later blocks. Blocks that need another
// machine, Docker or minutes say so in their first line and are
// skipped; blocks for a stopped service run last, after it stops. So
// that the test does not take the default ports or write outside its
// directories, what the commands name is pointed at the test's
// service and directory: the addresses, `$(go env GOPATH)/bin`, the
// absolute example directories (/etc/telemetryd, /var/lib/telemetryd,
// /mnt/backup) under a temporary root, and `go run PKG` at binaries
// built once.
func TestReadmeQuickStart(t *testing.T) {
	inLane(t, lanes.general)
	for _, tool := range []string{"curl", "mosquitto_pub", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (.ci/run installs it)", tool)
		}
	}
	var blocks []shellBlock
	for _, page := range shellDocs {
		blocks = append(blocks, shellBlocks(t, page)...)
	}
	quick := quickStart(t, docFile(t, "README.md"))

	work := t.TempDir()
	bin := filepath.Join(work, "bin")
	root := filepath.Join(work, "root")
	for _, d := range []string{bin, filepath.Join(root, "etc", "telemetryd"), filepath.Join(root, "var", "lib"), filepath.Join(root, "mnt", "backup")} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	cfg := newTestConfig(t)
	cfg.LogLevel = "warn"
	cfg.DataDir = filepath.Join(root, "var", "lib", "telemetryd")
	cfg.BackupDir = work // the pages' backups go to ./data-backups and /var/lib/telemetryd-backups
	s := startService(t, cfg, func(m *Main) { m.now = time.Now })

	// go run PKG: built once, so the commands run at the speed a
	// newcomer's second run has (telemetryd and telemetry-sim come from
	// the README's install step).
	goRun := regexp.MustCompile(`go run (\S+)`)
	built := map[string]string{}
	for _, b := range blocks {
		for _, m := range goRun.FindAllStringSubmatch(b.code, -1) {
			pkg := m[1]
			if _, ok := built[pkg]; ok || pkg == "./cmd/telemetryd" || pkg == "./cmd/telemetry-sim" {
				continue
			}
			out := filepath.Join(bin, "run-"+filepath.Base(pkg))
			src := pkg
			if strings.HasPrefix(pkg, "./") {
				src = filepath.Join("..", "..", pkg)
			}
			o, err := exec.Command("go", "build", "-o", out, src).CombinedOutput()
			require.NoError(t, err, "go build %s: %s", pkg, o)
			built[pkg] = out
		}
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	host := strings.TrimPrefix(s.base, "http://")
	_, mqttPort, _ := strings.Cut(s.MQTTAddr(), ":")
	examplePaths := regexp.MustCompile(`(^|[\s'"=:])(/etc/telemetryd|/var/lib/telemetryd|/mnt/backup)`)
	rewrite := func(code string) string {
		code = strings.ReplaceAll(code, "go run github.com/nats-io/nats.go/examples/nats-pub", built["github.com/nats-io/nats.go/examples/nats-pub"]+" -s "+s.NATSURL())
		for pkg, path := range built {
			code = strings.ReplaceAll(code, "go run "+pkg, path)
		}
		code = strings.ReplaceAll(code, "go run ./cmd/telemetry-sim", "telemetry-sim")
		code = strings.ReplaceAll(code, "deploy/install.sh", filepath.Join(repo, "deploy", "install.sh"))
		code = strings.ReplaceAll(code, "$(go env GOPATH)/bin", bin)
		code = strings.ReplaceAll(code, "127.0.0.1:8080", host)
		code = strings.ReplaceAll(code, "localhost:8080", host)
		code = strings.ReplaceAll(code, "-p 1883", "-p "+mqttPort)
		return examplePaths.ReplaceAllString(code, "${1}"+root+"${2}")
	}
	env := append(os.Environ(),
		"GOBIN="+bin, "GOFLAGS=-buildvcs=false",
		"TELEMETRY_SIM_NATS_URL="+s.NATSURL(),
		"TOKEN=doc-test-token", "ADMIN_TOKEN=doc-test-token", // no auth file: read endpoints take no token, admin ones loopback clients
	)
	run := func(b shellBlock) string {
		t.Helper()
		cmd := exec.Command("bash", "-c", "set -euo pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\nexport PATH=\""+bin+":$PATH\"\n"+rewrite(b.code))
		cmd.Dir = work
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s:%d failed:\n%s\n--- output:\n%s", b.page, b.line, b.code, out)
		return string(out)
	}

	var all strings.Builder
	ran := 0
	for _, b := range blocks {
		if b.stopped {
			continue
		}
		out := run(b)
		ran++
		all.WriteString(out)
		if b.code == quick {
			// What a newcomer is told to look for is there.
			for _, want := range []string{`"device":"sim-0001"`, `"readings":[`, `"buckets":[`, `"status":"success"`, `"day":`, "telemetry_ingest_readings_total"} {
				assert.Contains(t, out, want, "the quick start's output")
			}
		}
	}
	s.stop(t)
	for _, b := range blocks {
		if b.stopped {
			all.WriteString(run(b))
			ran++
		}
	}
	t.Logf("ran %d shell blocks of %d pages", ran, len(shellDocs))
	assert.Greater(t, ran, 10)

	// The install step names the commit it built, although GOFLAGS
	// kept Go from stamping it.
	if head, err := exec.Command("git", "-C", repo, "rev-parse", "HEAD").Output(); err == nil {
		assert.Regexp(t, `telemetryd \S+ `+string(head[:12]), all.String(), "telemetryd -version names the commit")
	}
	// The pages' other promises: a backup and its restore, exports.
	for _, f := range []string{"data-backups/nightly/MANIFEST.json", "data-restored", "east.csv", "east.ndjson", "root/var/lib/telemetryd-backups/nightly/MANIFEST.json", "root/mnt/backup/telemetryd/MANIFEST.json", "root/var/lib/telemetryd-new"} {
		_, err := os.Stat(filepath.Join(work, f))
		assert.NoError(t, err, "the documented commands made %s", f)
	}
}

// shellBlocks returns the ```sh blocks of a page, without those whose
// first line says they are not run (which must give a reason).
func shellBlocks(t *testing.T, page string) []shellBlock {
	t.Helper()
	var blocks []shellBlock
	lines := strings.Split(docFile(t, page), "\n")
	for i := 0; i < len(lines); i++ {
		if lines[i] != "```sh" {
			continue
		}
		start := i + 1
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
		}
		code := strings.Join(lines[start:i], "\n") + "\n"
		first := lines[start]
		if strings.HasPrefix(first, notRun) {
			require.NotEmpty(t, strings.TrimSpace(strings.TrimPrefix(first, notRun)), "%s:%d says why it is not run", page, start)
			continue
		}
		blocks = append(blocks, shellBlock{page: page, line: start, code: code, stopped: strings.HasPrefix(first, stopped)})
	}
	return blocks
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
