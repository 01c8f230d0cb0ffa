package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fillDays publishes perDay readings for device on each of the given
// days before the test day, in messages of 100, and returns how many.
func fillDays(t *testing.T, s *testService, device string, daysBack []int, perDay int) int {
	t.Helper()
	today := testEpoch.Truncate(24 * time.Hour)
	n := 0
	for _, d := range daysBack {
		day := today.AddDate(0, 0, -d)
		for i := 0; i < perDay; i += 100 {
			var b strings.Builder
			b.WriteByte('[')
			for j := i; j < min(i+100, perDay); j++ {
				if j > i {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `{"ts":%d,"v":%d}`, day.Add(time.Duration(j)*time.Second).UnixMilli(), j)
				n++
			}
			b.WriteByte(']')
			s.publish(t, device, b.String())
		}
	}
	return n
}

func (s *testService) do(t *testing.T, method, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.base+path, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// TestDropDaysWhileIngestingAndQuerying drops old day tables while
// readings pour into today and queries sweep every day. Run it with
// -race too: go test -race -run TestDropDays ./cmd/telemetryd
func TestDropDaysWhileIngestingAndQuerying(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	perDay := 1000
	fillDays(t, s, "dev-r", []int{4, 3, 2, 1}, perDay)
	waitStored(t, s, "dev-r", 2*perDay) // only the last 3 days are in pageAll's window
	today := testEpoch.Truncate(24 * time.Hour)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var published atomic.Int64
	wg.Go(func() { // ingest into today; every publish is waited for, so the count is exact
		for i := 0; ctx.Err() == nil; i++ {
			at := today.Add(time.Duration(i) * time.Millisecond)
			_, err := s.js.Publish(context.Background(), "telemetry.dev-r", fmt.Appendf(nil, `{"ts":%d,"today":%d}`, at.UnixMilli(), i))
			if !assert.NoError(t, err) {
				return
			}
			published.Add(1)
		}
	})
	var queryErrors atomic.Int64
	var failures sync.Map
	for w := 0; w < 2; w++ {
		wg.Go(func() { // queries over every day
			q := url.Values{"from": {today.AddDate(0, 0, -5).Format(time.RFC3339)}, "to": {testEpoch.Format(time.RFC3339)}, "limit": {"500"}}
			paths := []string{"/v1/devices/dev-r/readings/latest?limit=50", "/v1/devices/dev-r/readings?" + q.Encode(), "/v1/tables", "/v1/devices"}
			for i := 0; ctx.Err() == nil; i++ {
				resp, err := http.Get(s.base + paths[i%len(paths)])
				if err != nil {
					continue
				}
				if resp.StatusCode != http.StatusOK {
					queryErrors.Add(1)
					var b bytes.Buffer
					_, _ = b.ReadFrom(resp.Body)
					failures.Store(paths[i%len(paths)], b.String())
				}
				resp.Body.Close()
			}
		})
	}
	for _, d := range []int{4, 3, 2} {
		time.Sleep(100 * time.Millisecond)
		code, body := s.do(t, http.MethodDelete, "/v1/tables/"+today.AddDate(0, 0, -d).Format("2006-01-02"))
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"reason":"manual"`)
	}
	time.Sleep(200 * time.Millisecond)
	cancel()
	wg.Wait()
	failures.Range(func(k, v any) bool { t.Errorf("query %s failed: %s", k, v); return true })
	assert.Zero(t, queryErrors.Load(), "queries must see dropped days as empty, never fail")

	// The kept day is whole, the dropped ones are empty, and every
	// reading acked into today is stored.
	waitStored(t, s, "dev-r", perDay+int(published.Load()))
	for _, d := range []int{4, 3, 2} {
		day := today.AddDate(0, 0, -d)
		var l apiList
		q := url.Values{"from": {day.Format(time.RFC3339)}, "to": {day.AddDate(0, 0, 1).Format(time.RFC3339)}}
		code, body := s.get(t, "/v1/devices/dev-r/readings?"+q.Encode(), &l)
		require.Equal(t, http.StatusOK, code, body)
		assert.Empty(t, l.Readings, "day %s was dropped", day.Format("2006-01-02"))
	}
	var tables struct {
		Tables []struct {
			Day string `json:"day"`
		} `json:"tables"`
	}
	s.get(t, "/v1/tables", &tables)
	var days []string
	for _, tb := range tables.Tables {
		days = append(days, tb.Day)
	}
	assert.Equal(t, []string{today.AddDate(0, 0, -1).Format("2006-01-02"), today.Format("2006-01-02")}, days)
}

func TestTooOldNeverRecreatesADroppedDay(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.Retention = 36 * time.Hour // at 12:00, the day before yesterday ends exactly at the cutoff
	s := startService(t, cfg)
	today := testEpoch.Truncate(24 * time.Hour)
	dayBefore := today.AddDate(0, 0, -2)

	sub, err := s.nc.SubscribeSync("rejected.telemetry.dev-o")
	require.NoError(t, err)
	s.publish(t, "dev-o", fmt.Sprintf(`{"ts":%d,"v":1}`, dayBefore.Add(23*time.Hour).UnixMilli()))
	msg, err := sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "too_old", msg.Header.Get("Telemetry-Error-Code"))

	s.publish(t, "dev-o", fmt.Sprintf(`{"ts":%d,"v":2}`, testEpoch.Add(-time.Minute).UnixMilli()))
	waitStored(t, s, "dev-o", 1)
	_, body := s.get(t, "/v1/tables", nil)
	assert.NotContains(t, body, dayBefore.Format("2006-01-02"), "a too_old reading must not create its day table")
	_, err = os.Stat(filepath.Join(cfg.DataDir, "tables", dayBefore.Format("2006-01-02")))
	assert.ErrorIs(t, err, fs.ErrNotExist)
}

// snapshot lists every file under dir with its size and modification
// time.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[p] = fmt.Sprintf("%d %s", info.Size(), info.ModTime())
		return nil
	}))
	return out
}

func TestRetentionCommand(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	s := startService(t, cfg)
	fillDays(t, s, "dev-c", []int{2, 1, 0}, 200)
	waitStored(t, s, "dev-c", 600)

	// While the service holds the data dir, the command refuses.
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"retention", "-dry-run", "-data-dir", cfg.DataDir}, envMap(nil), &stdout, &stderr)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "in use by a running telemetryd")
	s.stop(t)

	// A retention whose cutoff falls in the middle of yesterday expires
	// exactly the day before yesterday.
	today := testEpoch.Truncate(24 * time.Hour)
	old, yesterday := today.AddDate(0, 0, -2).Format("2006-01-02"), today.AddDate(0, 0, -1).Format("2006-01-02")
	retention := time.Since(today.AddDate(0, 0, -1).Add(12 * time.Hour)).Round(time.Second).String()
	tables := filepath.Join(cfg.DataDir, "tables")
	before := snapshot(t, tables)

	stdout.Reset()
	stderr.Reset()
	code = run(context.Background(), []string{"retention", "-dry-run", "-data-dir", cfg.DataDir, "-retention", retention, "-log-level", "warn"}, envMap(nil), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	out := stdout.String()
	assert.Regexp(t, old+`\s+\d+\s+200\s+would drop \(expired\)`, out)
	assert.Regexp(t, yesterday+`\s+\d+\s+200\s+keep`, out)
	assert.Contains(t, out, "1 tables would be dropped")
	assert.Equal(t, before, snapshot(t, tables), "a dry run changes nothing on disk")

	stdout.Reset()
	code = run(context.Background(), []string{"retention", "-data-dir", cfg.DataDir, "-retention", retention, "-log-level", "warn"}, envMap(nil), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	assert.Regexp(t, old+`\s+\d+\s+200\s+drop \(expired\)`, stdout.String())
	_, err := os.Stat(filepath.Join(tables, old))
	assert.ErrorIs(t, err, fs.ErrNotExist)
	_, err = os.Stat(filepath.Join(tables, yesterday))
	assert.NoError(t, err)
}

func TestRetentionRunsAtStartAndOnRequest(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	s := startService(t, cfg)
	fillDays(t, s, "dev-e", []int{2, 1, 0}, 100)
	waitStored(t, s, "dev-e", 300)
	s.stop(t)

	// Restarted with 36h retention at 12:00, the day before yesterday
	// ends exactly at the cutoff: the run at start drops it.
	cfg.Retention = 36 * time.Hour
	s = startService(t, cfg)
	today := testEpoch.Truncate(24 * time.Hour)
	day := func(back int) string { return today.AddDate(0, 0, -back).Format("2006-01-02") }
	waitFor(t, 20*time.Millisecond, func() bool {
		_, body := s.get(t, "/v1/tables", nil)
		return !strings.Contains(body, day(2))
	}, "the retention run at start drops the expired day")
	_, body := s.get(t, "/v1/tables", nil)
	assert.Contains(t, body, day(1))
	assert.Contains(t, body, day(0))

	code, body := s.do(t, http.MethodPost, "/v1/retention/run?dry_run=true")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"dryRun":true`)
	assert.Contains(t, body, `"dropped":[]`, "nothing else has expired")

	code, body = s.do(t, http.MethodDelete, "/v1/tables/"+day(1))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"readings":100`)
	code, body = s.do(t, http.MethodDelete, "/v1/tables/"+day(1))
	assert.Equal(t, http.StatusNotFound, code, body)
}

// GET /v1/tables reports the expiry the retention policy applies,
// -retention-max-bytes included: a table the size limit drops at the
// next run expires now, not at its day end + retention.
func TestTablesExpiryFollowsTheSizeLimit(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.RetentionMaxBytes = 1 // every table but today's is over the limit
	s := startService(t, cfg)
	fillDays(t, s, "dev-x", []int{2, 1, 0}, 100)
	waitStored(t, s, "dev-x", 300)

	var got struct {
		Tables []struct {
			Day       string    `json:"day"`
			SizeBytes int64     `json:"sizeBytes"`
			ExpiresAt time.Time `json:"expiresAt"`
		} `json:"tables"`
	}
	code, body := s.get(t, "/v1/tables", &got)
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, got.Tables, 3, body)
	today := testEpoch.Truncate(24 * time.Hour)
	for _, tb := range got.Tables {
		day, err := time.Parse("2006-01-02", tb.Day)
		require.NoError(t, err)
		if day.Equal(today) {
			assert.Equal(t, today.Add(24*time.Hour+cfg.Retention), tb.ExpiresAt, "today's table is never dropped by the size limit")
			continue
		}
		require.Positive(t, tb.SizeBytes, body)
		assert.WithinDuration(t, s.now(), tb.ExpiresAt, time.Minute, "%s is over the size limit: it expires at the next run, not on %s",
			tb.Day, day.Add(24*time.Hour+cfg.Retention).Format(time.RFC3339))
	}
}
