package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAggregatesOutliveTheirDayWithRollups: with -rollups, the hourly
// aggregates of a day answered over HTTP are the same after the day
// table is dropped, and the rollup counter shows the buckets written.
func TestAggregatesOutliveTheirDayWithRollups(t *testing.T) {
	cfg := newTestConfig(t)
	cfg.Rollups = "1m:90d,1h:3y"
	s := startService(t, cfg)
	n := fillDays(t, s, "dev-r", []int{2}, 7200) // two hours at one reading a second
	waitStored(t, s, "dev-r", n)
	day := testEpoch.Truncate(24*time.Hour).AddDate(0, 0, -2)
	path := "/v1/devices/dev-r/aggregates?interval=1h&fn=count,sum,min,max,avg,first,last&from=" +
		day.Format(time.RFC3339) + "&to=" + day.Add(24*time.Hour).Format(time.RFC3339)
	var before, after map[string]any
	code, body := s.get(t, path, &before)
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, before["buckets"], 2, body)

	code, body = s.do(t, http.MethodDelete, "/v1/tables/"+day.Format("2006-01-02"))
	require.Equal(t, http.StatusOK, code, body)
	code, body = s.get(t, path, &after)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, before, after)

	code, metrics := s.do(t, http.MethodGet, "/metrics")
	require.Equal(t, http.StatusOK, code)
	v, ok := metricValue(metrics, "telemetry_store_rollup_buckets_total", "")
	require.True(t, ok)
	assert.Equal(t, float64(2*60+2), v, "two hours of minutes and two hours")
}
