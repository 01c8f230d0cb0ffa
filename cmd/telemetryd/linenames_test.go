package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// promClient is the Prometheus Go client on s's API.
func promClient(t *testing.T, s *testService) v1.API {
	t.Helper()
	c, err := promapi.NewClient(promapi.Config{Address: s.base})
	require.NoError(t, err)
	return v1.NewAPI(c)
}

// writeLine posts one line of line protocol with its time at.
func writeLine(t *testing.T, s *testService, line string, at time.Time) {
	t.Helper()
	code, body := s.post(t, "/api/v2/write?bucket=b&precision=ns", fmt.Appendf(nil, "%s %d\n", line, at.UnixNano()), nil)
	require.Equal(t, http.StatusNoContent, code, body)
}

// instantValues asks query at `at` and returns value per __name__ (the
// series' name, or "" when the query drops it) of the device's series.
func instantValues(t *testing.T, api v1.API, query string, at time.Time) map[string]float64 {
	t.Helper()
	val, _, _, err := api.Query(context.Background(), query, at)
	require.NoError(t, err, query)
	vec, ok := val.(model.Vector)
	require.True(t, ok, "%s: %T", query, val)
	out := map[string]float64{}
	for _, s := range vec {
		out[string(s.Metric[model.MetricNameLabel])] = float64(s.Value)
	}
	return out
}

// names is what /api/v1/label/__name__/values lists around at: what
// Grafana's query builder offers.
func names(t *testing.T, api v1.API, at time.Time) []string {
	t.Helper()
	vals, _, _, err := api.LabelValues(context.Background(), model.MetricNameLabel, nil, at.Add(-time.Hour), at)
	require.NoError(t, err)
	out := make([]string, len(vals))
	for i, v := range vals {
		out[i] = string(v)
	}
	return out
}

// A line as Telegraf writes it is queryable by the name PromQL writes
// plainly, measurement_field, and listed so where Grafana's builder
// looks.
func TestLineProtocolNamesForPromQL(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	at := testEpoch.Add(-time.Minute)
	writeLine(t, s, "climate,device=boiler-7 temp=21.5", at)
	waitStored(t, s, "boiler-7", 1)

	api := promClient(t, s)
	assert.Equal(t, map[string]float64{"climate_temp": 21.5}, instantValues(t, api, `climate_temp{device="boiler-7"}`, testEpoch))
	assert.Contains(t, names(t, api, testEpoch), "climate_temp")
	assert.NotContains(t, names(t, api, testEpoch), "climate.temp")
}

// With -line-name-separator . lines get the names of earlier releases,
// climate.temp, which PromQL reaches only quoted. Data stored under
// those names keeps them when the service restarts with the default:
// old readings answer to {"climate.temp"}, new ones to climate_temp.
func TestLineNameSeparatorDotKeepsEarlierNames(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.LineNameSeparator = "."
	s := startService(t, cfg)
	old := testEpoch.Add(-2 * time.Minute)
	writeLine(t, s, "climate,device=boiler-7 temp=21.5", old)
	waitStored(t, s, "boiler-7", 1)

	api := promClient(t, s)
	assert.Equal(t, map[string]float64{"climate.temp": 21.5}, instantValues(t, api, `{"climate.temp", device="boiler-7"}`, testEpoch))
	assert.Contains(t, names(t, api, testEpoch), "climate.temp")
	assert.NotContains(t, names(t, api, testEpoch), "climate_temp")
	_, _, _, err := api.Query(context.Background(), `climate.temp{device="boiler-7"}`, testEpoch)
	var perr *v1.Error
	require.True(t, errors.As(err, &perr), "unquoted, a name with a dot is not PromQL: %v", err)
	assert.Equal(t, v1.ErrBadData, perr.Type)
	s.stop(t)

	// The same data dir under the default separator.
	cfg.LineNameSeparator = DefaultConfig().LineNameSeparator
	require.Equal(t, "_", cfg.LineNameSeparator)
	s = startService(t, cfg)
	writeLine(t, s, "climate,device=boiler-7 temp=22.5", testEpoch.Add(-time.Minute))
	waitStored(t, s, "boiler-7", 2)
	api = promClient(t, s)
	assert.Equal(t, map[string]float64{"climate.temp": 21.5}, instantValues(t, api, `{"climate.temp", device="boiler-7"}`, testEpoch),
		"what was stored keeps its name")
	assert.Equal(t, map[string]float64{"climate_temp": 22.5}, instantValues(t, api, `climate_temp{device="boiler-7"}`, testEpoch))
	assert.Subset(t, names(t, api, testEpoch), []string{"climate.temp", "climate_temp"})
	// One query over both names (a dashboard across the change).
	assert.Equal(t, map[string]float64{"": 44},
		instantValues(t, api, `sum(last_over_time({__name__=~"climate[._]temp", device="boiler-7"}[5m]))`, testEpoch))
}

// -line-name-separator takes _ or . and names itself when given
// anything else.
func TestLineNameSeparatorFlag(t *testing.T) {
	inLane(t, lanes.general)
	for _, sep := range []string{"_", "."} {
		cfg := DefaultConfig()
		cfg.LineNameSeparator = sep
		assert.NoError(t, cfg.Validate(), sep)
	}
	cfg := DefaultConfig()
	cfg.LineNameSeparator = "-"
	assert.EqualError(t, cfg.Validate(), `-line-name-separator "-": want "_" or "."`)
}
