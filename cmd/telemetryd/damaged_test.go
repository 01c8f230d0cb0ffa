package main

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// damageTable flips three bytes in the middle of the largest file of
// the day table of day under dataDir (a stopped service's), as a
// failing disk would, and checks that the table no longer opens.
func damageTable(t *testing.T, dataDir string, day buckets.Day) {
	t.Helper()
	dir := store.TableDir(dataDir, day)
	ssts, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	require.NoError(t, err)
	require.NotEmpty(t, ssts, "the table of %s has no table file", day)
	slices.SortFunc(ssts, func(a, b string) int { return int(fileSize(t, b) - fileSize(t, a)) })
	b, err := os.ReadFile(ssts[0])
	require.NoError(t, err)
	for i := range 3 {
		b[len(b)/2+i*7] ^= 0x5a
	}
	require.NoError(t, os.WriteFile(ssts[0], b, 0o600))
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Size()
}

// readyz returns the status and body of /readyz.
func (s *testService) readyz(t *testing.T) (int, string) {
	t.Helper()
	return s.get(t, "/readyz", nil)
}

// TestDamagedTableHoldsAckedReadingsUntilDropped: a day table damaged
// while the service was stopped does not open. Readings of that day
// published afterwards are acked (the stream holds them), /readyz
// fails naming the day and both ways out, the blocked-table gauge
// says so; once the operator drops the table, every one of them is
// stored in the new table and none is skipped as day_dropped.
func TestDamagedTableHoldsAckedReadingsUntilDropped(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	s := startService(t, cfg)
	at := testEpoch.Add(-2 * time.Hour)
	day := buckets.DayOf(buckets.MustTicks(at))
	var payloads []string
	for i := range 200 {
		payloads = append(payloads, fmt.Sprintf(`{"ts":%q,"values":{"temp":%d,"pad":"%0200d"}}`,
			at.Add(time.Duration(i)*time.Second).Format(time.RFC3339), i, i))
	}
	s.publishEach(t, "dev-d", payloads)
	waitStored(t, s, "dev-d", 200)
	s.stop(t)
	damageTable(t, cfg.DataDir, day)

	s = startService(t, cfg)
	const n = 300
	payloads = payloads[:0]
	for i := range n {
		payloads = append(payloads, fmt.Sprintf(`{"ts":%q,"values":{"temp":%d}}`,
			at.Add(time.Duration(i)*time.Second).Format(time.RFC3339), i))
	}
	s.publishEach(t, "dev-e", payloads)
	var body string
	waitFor(t, 50*time.Millisecond, func() bool {
		var code int
		code, body = s.readyz(t)
		// The store's own check, not only the ingester's pause reason
		// (which the gauge below does not count).
		return code == http.StatusServiceUnavailable && strings.Contains(body, "readiness: store cannot commit")
	}, "/readyz never failed for the damaged table")
	assert.Contains(t, body, "table "+day.String())
	assert.Contains(t, body, "telemetryd repair -day "+day.String())
	assert.Contains(t, body, "DELETE /v1/tables/"+day.String())
	mfs := scrape(t, s)
	v, ok := sample(mfs, "telemetry_store_blocked_tables", map[string]string{"reason": "damaged"})
	require.True(t, ok, "the gauge is exported")
	if !assert.Equal(t, float64(1), v) {
		_, now := s.readyz(t)
		t.Logf("/readyz when it said so: %s; now: %s; the gauge: %v", body, now, mfs["telemetry_store_blocked_tables"])
	}

	q := url.Values{"from": {at.Add(-time.Minute).Format(time.RFC3339)}, "to": {at.Add(time.Hour).Format(time.RFC3339)}}
	code, out := s.get(t, "/v1/devices/dev-d/readings?"+q.Encode(), nil)
	assert.Equal(t, http.StatusServiceUnavailable, code, out)
	assert.Contains(t, out, "telemetryd repair -day "+day.String(), "the 503 names both ways out")
	assert.Contains(t, out, "DELETE /v1/tables/"+day.String())

	code, out = s.do(t, http.MethodDelete, "/v1/tables/"+day.String())
	require.Equal(t, http.StatusOK, code, out)
	waitStored(t, s, "dev-e", n)
	s.waitReady(t)
	skipped, _ := sample(scrape(t, s), "telemetry_ingest_readings_total", map[string]string{"outcome": "skipped", "code": "day_dropped"})
	assert.Zero(t, skipped, "no acked reading is skipped as day_dropped")
	v, _ = sample(scrape(t, s), "telemetry_store_blocked_tables", map[string]string{"reason": "damaged"})
	assert.Zero(t, v)
}
