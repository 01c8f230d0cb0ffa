package main

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBackupRestoreKeepsRollupsOfADroppedDay: with -rollups, a day
// whose table was dropped answers its hourly aggregates from the
// rollups; an offline backup and a restore keep them, with a progress
// line per rollup database, and the service started on the restored
// data dir answers the same.
func TestBackupRestoreKeepsRollupsOfADroppedDay(t *testing.T) {
	inLane(t, lanes.general)
	ctx := context.Background()
	env := func(string) string { return "" }
	cfg := newTestConfig(t)
	cfg.Rollups = "1m:90d,1h:3y"
	s := startService(t, cfg)
	n := fillDays(t, s, "dev-r", []int{2}, 7200) // two hours at one reading a second
	waitStored(t, s, "dev-r", n)
	day := testEpoch.Truncate(24*time.Hour).AddDate(0, 0, -2)
	path := "/v1/devices/dev-r/aggregates?interval=1h&fn=count,sum,min,max,avg,first,last&from=" +
		day.Format(time.RFC3339) + "&to=" + day.Add(24*time.Hour).Format(time.RFC3339)
	code, body := s.do(t, http.MethodDelete, "/v1/tables/"+day.Format("2006-01-02"))
	require.Equal(t, http.StatusOK, code, body)
	var before, after map[string]any
	code, body = s.get(t, path, &before)
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, before["buckets"], 2, body)
	s.stop(t)

	bdir := t.TempDir()
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"backup", "-data-dir", cfg.DataDir, "-to", bdir}, env, &stdout, &stderr), stderr.String())
	assert.Contains(t, stdout.String(), " rollups/1m/"+day.Format("2006-01")+" copied ")
	assert.Contains(t, stdout.String(), " rollups/1h/"+day.Format("2006")+"-01 copied ")

	stdout.Reset()
	dataDir := filepath.Join(t.TempDir(), "restored")
	require.Equal(t, 0, run(ctx, []string{"restore", "-from", bdir, "-data-dir", dataDir}, env, &stdout, &stderr), stderr.String())
	assert.Contains(t, stdout.String(), " rollups/1m/"+day.Format("2006-01")+" loaded ")
	assert.Contains(t, stdout.String(), "2 rollup databases")

	cfg2 := cfg
	cfg2.DataDir = dataDir
	s2 := startService(t, cfg2)
	t.Cleanup(func() { s2.stop(t) })
	code, body = s2.get(t, path, &after)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, before, after)
}
