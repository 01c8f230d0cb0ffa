package backupclient_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/cmd/internal/backupclient"
	"github.com/telemetryd/telemetryd/store"
	"github.com/telemetryd/telemetryd/store/backup"
)

// storeBackups backs up a real store, as the service does.
type storeBackups struct{ st *store.Store }

func (b storeBackups) Backup(ctx context.Context, dir string, full bool) (api.BackupSummary, error) {
	m, err := b.st.Backup(ctx, dir, backup.Options{Full: full})
	if err != nil {
		return api.BackupSummary{}, err
	}
	return backupclient.SummaryOf(dir, m), nil
}

// serve fills a Badger store and serves POST /v1/backup on loopback,
// under root, with admin token "secret". The store is settled first:
// written, closed (which merges every open block, as the compactor
// would within a second or two) and opened again, so no compaction
// rewrites its tables between two backups of a test.
func serve(t *testing.T, root string) (*store.Store, string) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, dir, store.DefaultOptions())
	require.NoError(t, err)
	start := buckets.MustTicks(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
	var rs []buckets.Reading
	for i := range 100 {
		rs = append(rs, buckets.Reading{Device: "dev-1", Ticks: start + buckets.Ticks(i)*buckets.TicksPerDay/50,
			Values: []buckets.Field{{Name: "temp", Value: buckets.Float(float64(i))}}})
	}
	require.NoError(t, st.Write(ctx, rs))
	require.NoError(t, st.SavePosition(ctx, buckets.StreamPosition{Stream: "TELEMETRY", Created: time.Now(), Seq: 41}))
	require.NoError(t, st.Close())
	st, err = store.Open(ctx, dir, store.DefaultOptions())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Close()) })
	srv, err := api.New(api.Config{Addr: "127.0.0.1:0", Reader: st, Backups: storeBackups{st}, BackupRoot: root,
		CursorKey: []byte("test cursor key"), Auth: auth.Static(&auth.File{Tokens: []auth.Token{
			{Name: "ops", Secret: auth.HashSecret("secret"), Scopes: []auth.Scope{auth.ScopeAdmin}}}})})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return st, hs.URL
}

func TestBackupThroughTheService(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	_, url := serve(t, root)
	c, err := backupclient.New(url+"/", "secret")
	require.NoError(t, err)

	dir := filepath.Join(root, "b")
	sum, err := c.Backup(ctx, dir, false)
	require.NoError(t, err)
	assert.Equal(t, dir, sum.Dir)
	assert.Equal(t, 1, sum.ID)
	assert.Equal(t, 2, sum.Tables, "two days")
	assert.Equal(t, map[string]uint64{"TELEMETRY": 41}, sum.Positions)
	assert.Positive(t, sum.CopiedBytes)
	assert.FileExists(t, filepath.Join(dir, "MANIFEST.json"))

	again, err := c.Backup(ctx, dir, false)
	require.NoError(t, err)
	assert.Equal(t, 2, again.ID)
	assert.Equal(t, 2, again.Skipped, "nothing changed")
	assert.Equal(t, sum.TotalBytes, again.TotalBytes)

	var out bytes.Buffer
	backupclient.PrintSummary(&out, again)
	assert.Equal(t, "backup 2 in "+dir+": 2 tables (2 unchanged), copied 0 files, 0 B; a restore loads "+
		backupclient.SizeText(again.TotalBytes)+"\nstream positions: TELEMETRY after 41\n", out.String())
}

// A refusal comes back with the service's status and message.
func TestBackupRefusals(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	_, url := serve(t, root)

	noToken, err := backupclient.New(url, "")
	require.NoError(t, err)
	_, err = noToken.Backup(ctx, filepath.Join(root, "b"), false)
	require.ErrorContains(t, err, url+" answered 401 Unauthorized: ")

	c, err := backupclient.New(url, "secret")
	require.NoError(t, err)
	_, err = c.Backup(ctx, t.TempDir(), false)
	require.ErrorContains(t, err, url+" answered 400 Bad Request: ")
	assert.ErrorContains(t, err, "outside the backup root")

	_, err = backupclient.New("http://[::1", "")
	assert.Error(t, err, "a URL that does not parse")
}

func TestTexts(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 20: "3.0 MiB", 5 << 30: "5.0 GiB"} {
		assert.Equal(t, want, backupclient.SizeText(n))
	}
	assert.Equal(t, "A after 3, B after 1", backupclient.PositionsText(map[string]uint64{"B": 1, "A": 3}))
	assert.Contains(t, backupclient.PositionsText(nil), "none saved")

	var out bytes.Buffer
	progress := backupclient.PrintProgress(&out, "copied")
	progress(backup.Progress{Name: "index", Done: 1, Total: 2, Bytes: 2048})
	progress(backup.Progress{Name: "2026-01-02", Done: 2, Total: 2, Skipped: true})
	assert.Equal(t, "[1/2] index copied 2.0 KiB\n[2/2] 2026-01-02 unchanged\n", out.String())
}
