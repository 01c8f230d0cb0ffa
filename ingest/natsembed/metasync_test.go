package natsembed

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A pass fsyncs the metadata files that changed since the last one and
// leaves the message blocks to the server.
func TestMetaSyncerSyncsChangedMetadata(t *testing.T) {
	dir := t.TempDir()
	stream := filepath.Join(dir, "$G", "streams", "TELEMETRY_0")
	consumer := filepath.Join(stream, "obs", "ingest")
	require.NoError(t, os.MkdirAll(filepath.Join(stream, "msgs"), 0o755))
	require.NoError(t, os.MkdirAll(consumer, 0o755))
	write := func(path string, at time.Time) {
		require.NoError(t, os.WriteFile(path, []byte("x"), 0o600))
		require.NoError(t, os.Chtimes(path, at, at))
	}
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	for _, p := range []string{filepath.Join(stream, "meta.inf"), filepath.Join(stream, "meta.sum"), filepath.Join(consumer, "o.dat"), filepath.Join(stream, "msgs", "1.blk")} {
		write(p, t0)
	}

	m := &metaSyncer{dir: dir}
	require.NoError(t, m.pass())
	assert.ElementsMatch(t, []string{filepath.Join(stream, "meta.inf"), filepath.Join(stream, "meta.sum"), filepath.Join(consumer, "o.dat")},
		keys(m.seen), "metadata synced; message blocks are not its to sync")

	write(filepath.Join(consumer, "o.dat"), t0.Add(time.Second))
	require.NoError(t, os.Remove(filepath.Join(stream, "meta.sum")))
	require.NoError(t, m.pass())
	assert.True(t, t0.Add(time.Second).Equal(m.seen[filepath.Join(consumer, "o.dat")]), "a changed file is synced again")
	assert.True(t, t0.Equal(m.seen[filepath.Join(stream, "meta.inf")]), "an unchanged one keeps its entry")
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
