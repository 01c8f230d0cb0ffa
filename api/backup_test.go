package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// fakeBackups records the backups asked for.
type fakeBackups struct {
	calls []api.BackupRequest
	err   error
}

func (f *fakeBackups) Backup(_ context.Context, dir string, full bool) (api.BackupSummary, error) {
	f.calls = append(f.calls, api.BackupRequest{Dir: dir, Full: full})
	if f.err != nil {
		return api.BackupSummary{}, f.err
	}
	return api.BackupSummary{Dir: dir, ID: 2, Created: testNow, Tables: 3, Skipped: 2, CopiedFiles: 2, CopiedBytes: 1234,
		TotalBytes: 99999, Positions: map[string]uint64{"TELEMETRY": 42}}, nil
}

func postBackup(t *testing.T, env *testEnv, body string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, env.url+"/v1/backup", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{status: res.StatusCode, header: res.Header, body: b}
}

func TestBackupEndpoint(t *testing.T) {
	fb := &fakeBackups{}
	root := t.TempDir()
	env := newTestEnv(t, func(c *api.Config) { c.Backups = fb; c.BackupRoot = root })
	dir, x := filepath.Join(root, "telemetry"), `{"dir":"`+filepath.Join(root, "x")+`"}`

	res := postBackup(t, env, `{"dir":"`+dir+`","full":true}`)
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	var got map[string]any
	require.NoError(t, json.Unmarshal(res.body, &got))
	assert.Equal(t, float64(1234), got["copiedBytes"])
	assert.Equal(t, map[string]any{"TELEMETRY": float64(42)}, got["positions"])
	assert.Equal(t, []api.BackupRequest{{Dir: dir, Full: true}}, fb.calls)

	for _, tc := range []struct{ name, body, param string }{
		{"relative", `{"dir":"backups"}`, "dir"},
		{"unclean", `{"dir":"/var/backups/../../etc"}`, "dir"},
		{"missing", `{}`, "dir"},
		{"unknown field", `{"dir":"/x","to":"/y"}`, "body"},
		{"not json", `dir=/x`, "body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireError(t, postBackup(t, env, tc.body), http.StatusBadRequest, "invalid_argument", tc.param)
		})
	}
	assert.Len(t, fb.calls, 1, "refused requests reach no backup")

	requireError(t, postBackup(t, env, x+strings.Repeat(" ", api.MaxBackupBodyBytes)), http.StatusRequestEntityTooLarge, "payload_too_large", "")
	postBackup(t, env, x+strings.Repeat(" ", api.MaxBackupBodyBytes-len(x)))
	assert.Len(t, fb.calls, 2, "a body of exactly the limit is read")

	fb.err = fmt.Errorf("%w: dir: /x is outside the backup root /b", buckets.ErrInvalidArgument)
	msg := requireError(t, postBackup(t, env, x), http.StatusBadRequest, "invalid_argument", "")
	assert.Contains(t, msg, "outside the backup root")
}

// POST /v1/backup refuses, before any backup starts, a dir outside the
// root, the root itself, and a path through a symbolic link leading
// out; nothing is created outside the root.
func TestBackupEndpointStaysUnderTheRoot(t *testing.T) {
	fb := &fakeBackups{}
	root := t.TempDir()
	env := newTestEnv(t, func(c *api.Config) { c.Backups = fb; c.BackupRoot = root })
	outside := t.TempDir()
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "link")))
	for _, dir := range []string{outside, root, filepath.Dir(root), filepath.Join(root, "link"), filepath.Join(root, "link", "deeper")} {
		msg := requireError(t, postBackup(t, env, `{"dir":"`+dir+`"}`), http.StatusBadRequest, "invalid_argument", "")
		assert.Contains(t, msg, "outside the backup root "+root, dir)
	}
	assert.Empty(t, fb.calls, "refused requests reach no backup")
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing created outside the root")

	nested := filepath.Join(root, "ok", "nested")
	res := postBackup(t, env, `{"dir":"`+nested+`"}`)
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	assert.DirExists(t, nested)
	assert.Equal(t, []api.BackupRequest{{Dir: nested}}, fb.calls)
}

func TestBackupsNeedARoot(t *testing.T) {
	_, err := api.New(api.Config{Reader: newFakeReader(), Backups: &fakeBackups{}})
	require.ErrorContains(t, err, "BackupRoot")
}

func TestBackupEndpointOff(t *testing.T) {
	env := newTestEnv(t)
	requireError(t, postBackup(t, env, `{"dir":"/x"}`), http.StatusNotImplemented, "not_implemented", "")
}

func TestBackupEndpointNeedsAdmin(t *testing.T) {
	env := newAuthEnv(t)
	for _, tk := range []string{readAll, writeOnly, metricsTk} {
		requireError(t, env.do(t, http.MethodPost, "/v1/backup", bearer(tk)...), http.StatusForbidden, "permission_denied", "authorization")
	}
	requireError(t, env.do(t, http.MethodPost, "/v1/backup"), http.StatusUnauthorized, "unauthenticated", "authorization")
	// Past the scope check: this instance serves no backups.
	requireError(t, env.do(t, http.MethodPost, "/v1/backup", bearer(adminOnly)...), http.StatusNotImplemented, "not_implemented", "")
}
