package natsembed

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// SyncStreams' pass fsyncs the message blocks written lately and their
// directories; blocks not written for long and the metadata are not its
// to sync.
func TestSyncBlocksSyncsRecentMessageBlocks(t *testing.T) {
	dir := t.TempDir()
	msgs := filepath.Join(dir, "jetstream", "$G", "streams", "TELEMETRY_0", "msgs")
	require.NoError(t, os.MkdirAll(msgs, 0o755))
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	write := func(path string, at time.Time) {
		require.NoError(t, os.WriteFile(path, []byte("x"), 0o600))
		require.NoError(t, os.Chtimes(path, at, at))
	}
	write(filepath.Join(msgs, "1.blk"), now.Add(-time.Hour))
	write(filepath.Join(msgs, "2.blk"), now.Add(-time.Second))
	write(filepath.Join(msgs, "index.db"), now)
	write(filepath.Join(filepath.Dir(msgs), "meta.inf"), now)

	var synced []string
	require.NoError(t, syncBlocks(dir, now.Add(-streamSyncRecent), func(p string) error { synced = append(synced, p); return nil }))
	assert.Equal(t, []string{filepath.Join(msgs, "2.blk"), msgs}, synced)
}

// JetStream syncs at half the configured interval, so that a sync that
// itself takes a while still leaves at most about the interval between
// an ack and its fsync.
func TestJetStreamSyncsAtHalfTheInterval(t *testing.T) {
	srv, err := Start(Config{Listen: "127.0.0.1:0", StoreDir: filepath.Join(t.TempDir(), "nats"), SyncInterval: time.Second})
	require.NoError(t, err)
	defer srv.Shutdown()
	assert.Equal(t, 500*time.Millisecond, srv.NATS().JetStreamConfig().SyncInterval)
}
