package main

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBuildInfoNamesTheLinkedVersion: a binary installed by
// deploy/install.sh (with GOFLAGS=-buildvcs=false, so only -ldflags can
// name the commit) reports in /api/v1/status/buildinfo the version and
// commit its -version prints.
func TestBuildInfoNamesTheLinkedVersion(t *testing.T) {
	inLane(t, lanes.general)
	const version, commit = "v9.8.7", "0123456789abcdef0123456789abcdef01234567"
	work := t.TempDir()
	bin := filepath.Join(work, "bin")
	install := exec.Command("sh", filepath.Join("..", "..", "deploy", "install.sh"))
	install.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=-buildvcs=false",
		"TELEMETRY_VERSION="+version, "TELEMETRY_COMMIT="+commit)
	out, err := install.CombinedOutput()
	require.NoError(t, err, "%s", out)
	telemetryd := filepath.Join(bin, "telemetryd")

	out, err = exec.Command(telemetryd, "-version").Output()
	require.NoError(t, err)
	printed := strings.Fields(string(out))
	require.GreaterOrEqual(t, len(printed), 3, "%s", out)
	assert.Equal(t, []string{"telemetryd", version, commit[:12]}, printed[:3], "-version: %s", out)

	addr := freeLoopback(t)
	cmd := exec.Command(telemetryd, "-data-dir", filepath.Join(work, "data"), "-http-addr", addr,
		"-nats-listen", "127.0.0.1:0", "-mqtt-listen", "", "-log-level", "warn")
	cmd.Env = []string{} // no TELEMETRY_* from the test's environment
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	base := "http://" + addr
	waitReadyz(t, base)

	resp, err := http.Get(base + "/api/v1/status/buildinfo")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Version  string `json:"version"`
			Revision string `json:"revision"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	assert.Equal(t, "success", body.Status)
	assert.Equal(t, strings.TrimPrefix(version, "v"), body.Data.Version, "Prometheus' form: no leading v")
	assert.Equal(t, commit, body.Data.Revision)
	assert.True(t, strings.HasPrefix(body.Data.Revision, printed[2]), "the commit -version prints")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait())
}

// TestDeployLinksTheVersion: the image links the version and commit
// into the same variables as deploy/install.sh, from build args, and
// those are the variables cliflag reads.
func TestDeployLinksTheVersion(t *testing.T) {
	inLane(t, lanes.general)
	const pkg = "github.com/telemetryd/telemetryd/cmd/internal/cliflag"
	linked := func(text string) []string {
		t.Helper()
		require.Contains(t, text, "pkg="+pkg)
		var vars []string
		for _, m := range regexp.MustCompile(`-X \$pkg\.(\w+)=`).FindAllStringSubmatch(text, -1) {
			vars = append(vars, m[1])
		}
		slices.Sort(vars)
		return vars
	}
	want := []string{"commit", "commitTime", "version"}
	assert.Equal(t, want, linked(string(readDeploy(t, "install.sh"))), "install.sh")
	df := string(readDeploy(t, "Dockerfile"))
	assert.Equal(t, want, linked(df), "Dockerfile")
	for _, arg := range []string{"TELEMETRY_VERSION", "TELEMETRY_COMMIT", "TELEMETRY_COMMIT_TIME"} {
		assert.Regexp(t, `(?m)^ARG `+arg+`=`, df)
		assert.Contains(t, df, "=${"+arg+"}", "the build arg %s is linked in", arg)
	}
	assert.Regexp(t, `go build .*-buildvcs=false`, df, "the context has no git history; the commit comes from the build arg")
	src, err := os.ReadFile(filepath.Join("..", "internal", "cliflag", "cliflag.go"))
	require.NoError(t, err)
	for _, v := range want {
		assert.Regexp(t, `(?m)^\t`+v+`\s+string$`, string(src), "cliflag declares %s", v)
	}
}
