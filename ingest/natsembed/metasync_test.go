package natsembed

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A pass fsyncs every metadata file and the directories holding them,
// and leaves the message blocks to the server. It syncs a file again
// though its modification time did not move: the server replaces
// metadata by renaming a new file over it, which a coarse clock gives
// the same time.
func TestMetaSyncerSyncsMetadata(t *testing.T) {
	dir := t.TempDir()
	stream := filepath.Join(dir, "$G", "streams", "TELEMETRY_0")
	consumer := filepath.Join(stream, "obs", "ingest")
	require.NoError(t, os.MkdirAll(filepath.Join(stream, "msgs"), 0o755))
	require.NoError(t, os.MkdirAll(consumer, 0o755))
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	replace := func(path string) {
		require.NoError(t, os.WriteFile(path+".tmp", []byte("x"), 0o600))
		require.NoError(t, os.Chtimes(path+".tmp", t0, t0))
		require.NoError(t, os.Rename(path+".tmp", path))
	}
	for _, p := range []string{filepath.Join(stream, "meta.inf"), filepath.Join(stream, "meta.sum"), filepath.Join(consumer, "o.dat"), filepath.Join(stream, "msgs", "1.blk")} {
		replace(p)
	}

	synced := map[string]int{}
	m := &metaSyncer{dir: dir, sync: func(path string) error { synced[path]++; return nil }}
	require.NoError(t, m.pass())
	assert.ElementsMatch(t, []string{filepath.Join(stream, "meta.inf"), filepath.Join(stream, "meta.sum"), filepath.Join(consumer, "o.dat"),
		stream, consumer}, keys(synced), "metadata and its directories synced; message blocks are not its to sync")

	replace(filepath.Join(stream, "meta.inf"))
	require.NoError(t, os.Remove(filepath.Join(stream, "meta.sum")))
	require.NoError(t, m.pass())
	assert.Equal(t, 2, synced[filepath.Join(stream, "meta.inf")], "a file replaced within the same modification time is synced again")
	assert.Equal(t, 1, synced[filepath.Join(stream, "meta.sum")], "a removed file is not")
	assert.Equal(t, 2, synced[stream])
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
