package cliflag

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestApplyEnvCommandLineWins(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a := fs.String("nats-url", "def", "")
	b := fs.String("data-dir", "def", "")
	c := fs.String("log-level", "def", "")
	require.NoError(t, fs.Parse([]string{"-data-dir", "cli"}))
	env := map[string]string{"X_NATS_URL": "env", "X_DATA_DIR": "env"}
	require.NoError(t, ApplyEnv(fs, "X_", func(k string) string { return env[k] }))
	assert.Equal(t, "env", *a)
	assert.Equal(t, "cli", *b, "the command line wins")
	assert.Equal(t, "def", *c, "no variable: the default")
}

func TestApplyEnvNamesTheBadVariable(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var n int64
	fs.Var(Size(&n), "max-bytes", "")
	require.NoError(t, fs.Parse(nil))
	err := ApplyEnv(fs, "X_", func(k string) string { return map[string]string{"X_MAX_BYTES": "lots"}[k] })
	assert.ErrorContains(t, err, `X_MAX_BYTES="lots"`)

	require.NoError(t, fs.Parse([]string{"extra"}))
	assert.ErrorContains(t, ApplyEnv(fs, "X_", func(string) string { return "" }), `unexpected arguments: ["extra"]`)
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{"512MiB": 512 << 20, "4GiB": 4 << 30, "1048576": 1 << 20, "1GB": 1e9, "0": 0} {
		var n int64
		require.NoError(t, Size(&n).Set(in), in)
		assert.Equal(t, want, n, in)
		var back int64
		require.NoError(t, Size(&back).Set(Size(&n).String()), "String is a form Set accepts")
		assert.Equal(t, n, back)
	}
	var n int64
	assert.ErrorContains(t, Size(&n).Set("lots"), "want a size such as 512MiB")
	assert.ErrorContains(t, Size(&n).Set("16EiB"), "too large")
	assert.Equal(t, "1000", FormatBytes(1000))
	assert.Equal(t, "1GiB", FormatBytes(1<<30))
}

func TestPrintFlags(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	n := int64(4 << 30)
	fs.Var(Size(&n), "stream-max-bytes", "disk space of the stream")
	fs.Bool("version", false, "print the version")
	var b strings.Builder
	PrintFlags(&b, fs, "X_", "version")
	assert.Contains(t, b.String(), "  -stream-max-bytes size   [X_STREAM_MAX_BYTES]\n    \tdisk space of the stream (default 4GiB)\n")
	assert.Contains(t, b.String(), "  -version\n")
}

// TestVersionSetAtLinkTime: the version and commit set with -ldflags -X
// (deploy/install.sh) are what -version prints; TestReadmeQuickStart
// builds a real binary that way.
func TestVersionSetAtLinkTime(t *testing.T) {
	defer func(v, c, at string) { version, commit, commitTime = v, c, at }(version, commit, commitTime)
	version, commit, commitTime = "v1.2.3", "0123456789abcdef0123456789abcdef01234567-dirty", "2026-12-05T14:00:00Z"
	got := Version("telemetryd")
	assert.True(t, strings.HasPrefix(got, "telemetryd v1.2.3 0123456789ab-dirty 2026-12-05T14:00:00Z go"), got)
	assert.Equal(t, Build{Version: "v1.2.3", Commit: "0123456789abcdef0123456789abcdef01234567", Time: "2026-12-05T14:00:00Z", Dirty: true}, BuildOf(),
		"the build info the service reports")
}
