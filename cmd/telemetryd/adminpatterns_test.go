package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAdminEndpointsRefuseDeviceLimitedTokens: an admin token limited
// to a device pattern cannot take a backup (which would copy every
// device's tables), drop a day, run retention or repair a day, all of
// which act on every device's data; it can still delete a device of
// its own, and not one outside its patterns. A token for all devices
// takes the backup.
func TestAdminEndpointsRefuseDeviceLimitedTokens(t *testing.T) {
	inLane(t, lanes.general)
	f := newAuthFixture(t, []string{"boiler-7", "pump-1"},
		"boiler:admin,read:boiler-*", "ops:admin,read")
	cfg := newTestConfig(t)
	cfg.Security.AuthFile = f.path
	root := t.TempDir()
	cfg.BackupDir = root
	m := openTestService(t, cfg)
	base := "http://" + m.HTTPAddr()
	day := m.now().UTC().Format("2006-01-02")

	send := func(method, path, token, body string) (int, string) {
		req, err := http.NewRequest(method, base+path, bytes.NewBufferString(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	limited := f.tokens["boiler"]
	backupBody := `{"dir":"` + filepath.Join(root, "b1") + `"}`
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/backup", backupBody},
		{http.MethodDelete, "/v1/tables/" + day, ""},
		{http.MethodPost, "/v1/retention/run?dry_run=true", ""},
		{http.MethodPost, "/v1/tables/" + day + "/repair", ""},
	} {
		code, body := send(c.method, c.path, limited, c.body)
		assert.Equal(t, http.StatusForbidden, code, "%s %s: %s", c.method, c.path, body)
		assert.Contains(t, body, "limited to device patterns", "%s %s", c.method, c.path)
	}
	_, err := os.Stat(filepath.Join(root, "b1"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the refused backup wrote nothing")

	code, body := send(http.MethodDelete, "/v1/devices/pump-1", limited, "")
	assert.Equal(t, http.StatusNotFound, code, "a device outside the patterns: %s", body)
	code, body = send(http.MethodDelete, "/v1/devices/boiler-7", limited, "")
	assert.NotEqual(t, http.StatusForbidden, code, "its own device: %s", body)

	code, body = send(http.MethodPost, "/v1/backup", f.tokens["ops"], backupBody)
	assert.Equal(t, http.StatusOK, code, body)
}
