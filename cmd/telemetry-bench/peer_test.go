package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPeerDataSendsTheSameLinesMoved checks the line protocol both
// services are sent: every line with a name, in order, its time moved
// by the same whole days as the JSON messages, none without a name.
func TestPeerDataSendsTheSameLinesMoved(t *testing.T) {
	ns := tsbsT0.Add(10 * time.Second).UnixNano()
	file := writeTSBSFile(t, 3, 4000, fmt.Sprintf(`readings,fleet=North velocity=3i %d`, ns)) // no name: left out
	now := tsbsT0.Add(3*24*time.Hour + 12*time.Hour)                                          // the file spans 11 hours
	d, err := loadPeerData(file, now, true, nil)
	require.NoError(t, err)
	assert.Equal(t, 3*24*time.Hour, d.shift)
	assert.Equal(t, 1, d.dropped)
	assert.Equal(t, 2*3*4000, d.lines)
	assert.Equal(t, 3*4000, d.velocity)
	assert.Equal(t, 3*4000, d.status)
	assert.Equal(t, []string{"truck_0", "truck_1", "truck_2"}, d.trucks)
	require.Len(t, d.bodies, 3) // 24,000 lines in requests of 10,000
	var sent []string
	for _, b := range d.bodies {
		sent = append(sent, strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")...)
	}
	require.Len(t, sent, d.lines)
	assert.Equal(t, peerLinesPerRequest, strings.Count(string(d.bodies[0]), "\n"))
	first := sent[0]
	assert.True(t, strings.HasPrefix(first, "readings,name=truck_0,fleet=South,driver=Trish,model=H-2 load_capacity=1500,"), first)
	ts, err := strconv.ParseInt(first[strings.LastIndexByte(first, ' ')+1:], 10, 64)
	require.NoError(t, err)
	assert.Equal(t, tsbsT0.Add(3*24*time.Hour).UnixNano(), ts)
	assert.Equal(t, d.json.last, d.end)
}

// TestAttrPayloadCarriesTagsAsAttributes checks the JSON messages for a
// service with attributes: the tags are the first reading's
// "attributes", no reading carries them as values.
func TestAttrPayloadCarriesTagsAsAttributes(t *testing.T) {
	file := writeTSBSFile(t, 1, 2)
	now := tsbsT0.Add(24 * time.Hour)
	msgs, err := loadTSBSMessagesAs(file, now, nil, appendTSBSAttrPayload)
	require.NoError(t, err)
	require.Equal(t, 1, msgs.count())
	var readings []map[string]any
	require.NoError(t, json.Unmarshal(msgs.payloads[0], &readings), "%s", msgs.payloads[0])
	require.Len(t, readings, 2)
	assert.Equal(t, map[string]any{"fleet": "South", "driver": "Trish", "model": "H-2"}, readings[0]["attributes"])
	assert.NotContains(t, readings[1], "attributes")
	for _, r := range readings {
		for k, v := range r {
			if k != "attributes" {
				assert.NotEqual(t, "string", fmt.Sprintf("%T", v), "%s is a string value", k)
			}
		}
		assert.Contains(t, r, "readings.velocity")
		assert.Contains(t, r, "diagnostics.status")
	}
}

// TestFleetQuestionsParse checks that every question is valid PromQL in
// both dialects and names the metrics each way.
func TestFleetQuestionsParse(t *testing.T) {
	for _, q := range fleetQuestions("6h") {
		for _, d := range []promDialect{telemetrydDialect, peerDialect} {
			text := q.Query(d, "East")
			_, err := parser.NewParser(parser.Options{}).ParseExpr(text)
			require.NoError(t, err, "%s: %s", q.Name, text)
			if d.dot {
				assert.Contains(t, text, `__name__`, text)
				assert.NotContains(t, text, `readings_`, text)
				assert.NotContains(t, text, `diagnostics_`, text)
			} else {
				assert.NotContains(t, text, `readings.`, text)
				assert.NotContains(t, text, `diagnostics.`, text)
			}
		}
	}
}

// TestPeerFlags checks the peer comparison's flags at their limits.
func TestPeerFlags(t *testing.T) {
	var out strings.Builder
	_, err := parseFlags([]string{"-peer-binary", "vm"}, &out)
	require.ErrorContains(t, err, "-tsbs-file")
	_, err = parseFlags([]string{"-peer-binary", "vm", "-tsbs-file", "f", "-peer-runs", "line,influx"}, &out)
	require.ErrorContains(t, err, `-peer-runs line,influx: want some of line,json,peer,line-B,json-B`)
	_, err = parseFlags([]string{"-peer-binary", "vm", "-tsbs-file", "f", "-peer-runs", "line,line-B"}, &out)
	require.ErrorContains(t, err, "-compare")
	_, err = parseFlags([]string{"-peer-binary", "vm", "-tsbs-file", "f", "-fleet-queries", "-1"}, &out)
	require.ErrorContains(t, err, "-fleet-queries -1")
	cfg, err := parseFlags([]string{"-peer-binary", "vm", "-tsbs", "f"}, &out)
	require.NoError(t, err)
	assert.Equal(t, []string{"line", "json", "peer"}, cfg.PeerRuns)
	assert.Equal(t, 20, cfg.FleetQueries)
	assert.Equal(t, dashboardConfig{Refreshes: 30, Window: time.Hour, Step: time.Minute}, cfg.Dashboard)
	for _, bad := range [][]string{{"-fleet-dashboard", "-1"}, {"-dashboard-step", "1500ms"}, {"-dashboard-step", "0s"},
		{"-dashboard-window", "5s"}, {"-dashboard-window", "48h", "-dashboard-step", "1s"}} {
		_, err = parseFlags(append([]string{"-peer-binary", "vm", "-tsbs-file", "f"}, bad...), &out)
		require.ErrorContains(t, err, bad[0]+" ", bad)
	}
}

// TestDashboardRange checks that the window slides by 10 s per refresh,
// ends at the file's newest time (aligned down to the step) at the
// last, and spans the window.
func TestDashboardRange(t *testing.T) {
	c := dashboardConfig{Refreshes: 30, Window: time.Hour, Step: 10 * time.Second}
	newest := time.Date(2026, 11, 22, 6, 0, 7, 0, time.UTC)
	last := c.dashboardRange(newest, 29)
	assert.Equal(t, promTime(time.Date(2026, 11, 22, 6, 0, 0, 0, time.UTC)), last.Get("end"))
	assert.Equal(t, promTime(time.Date(2026, 11, 22, 5, 0, 0, 0, time.UTC)), last.Get("start"))
	assert.Equal(t, "10", last.Get("step"))
	first := c.dashboardRange(newest, 0)
	assert.Equal(t, promTime(time.Date(2026, 11, 22, 5, 55, 10, 0, time.UTC)), first.Get("end"))
	assert.Equal(t, promTime(time.Date(2026, 11, 22, 5, 55, 20, 0, time.UTC)), c.dashboardRange(newest, 1).Get("end"))
}

// TestPeerReportRatios checks the table's medians and ratios.
func TestPeerReportRatios(t *testing.T) {
	cfg := Config{Repeat: 3, PeerRuns: []string{"line", "peer", "line-B"}, Compare: "old"}
	d := &peerData{json: &tsbsMessages{readings: 100, values: 1000}}
	var runs []peerRun
	for i, r := range []float64{10, 30, 20} {
		runs = append(runs, peerRun{Kind: "line", Rate: r, Disk: 800, PeakRSS: 100 << 20},
			peerRun{Kind: "peer", Rate: 2 * r, Disk: 2000, PeakRSS: 50 << 20},
			peerRun{Kind: "line-B", Rate: r / 2, Disk: 900, PeakRSS: int64(i+1) << 20})
	}
	out := peerReport(cfg, d, runs, nil, nil, false)
	lines := strings.Split(out, "\n")
	find := func(prefix string) []string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return strings.Fields(strings.Join(strings.Split(l, "  ")[1:], " "))
			}
		}
		t.Fatalf("no row %q in\n%s", prefix, out)
		return nil
	}
	// line, peer, line-B, then line / peer and line B / line A.
	assert.Equal(t, []string{"20", "40", "10", "0.50", "0.50"}, find("ingest, readings/s until queryable"))
	assert.Equal(t, []string{"0.800", "B", "2.000", "B", "0.900", "B", "0.40", "1.12"}, find("disk per value"))
	assert.Contains(t, out, "B = old")
	assert.Contains(t, out, "does not turn line protocol tags into device attributes")

	// json-B is compared with json, not with the peer.
	cfg.PeerRuns = []string{"json", "json-B"}
	runs = runs[:0]
	for _, r := range []float64{10, 30, 20} {
		runs = append(runs, peerRun{Kind: "json", Rate: r, Disk: 800}, peerRun{Kind: "json-B", Rate: 3 * r, Disk: 400})
	}
	out = peerReport(cfg, d, runs, nil, nil, false)
	lines = strings.Split(out, "\n")
	assert.Contains(t, out, "JSON B / JSON A")
	assert.Equal(t, []string{"20", "60", "3.00"}, find("ingest, readings/s until queryable"))
}
