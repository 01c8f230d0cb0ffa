package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// TestUIAlertsInChromium runs a service with two alerting rules over
// three freezers, one of them warm with its door open, and opens the
// page in headless Chromium:
//   - above the device list an alerts box counts "1 firing, 1 pending ·
//     2 alerting rules" and lists the firing alert first (its severity,
//     device, expanded summary, value) and the pending one with how much
//     of its for has passed;
//   - the warm freezer's row carries its alerts' names, the others none;
//   - the warm freezer's page lists its two alerts above its charts; a
//     quiet freezer's page has no alerts box.
//
// TELEMETRY_UI_SCREENSHOTS=DIR writes alerts.png and device-alerts.png
// there (the README's screenshots).
func TestUIAlertsInChromium(t *testing.T) {
	inLane(t, lanes.chromium)
	ctx, _ := newBrowser(t)
	ruleFile := filepath.Join(t.TempDir(), "freezers.yml")
	require.NoError(t, os.WriteFile(ruleFile, []byte(`groups:
  - name: freezers
    interval: 1s
    rules:
      - alert: FreezerWarm
        expr: temp > -15
        for: 2s
        labels: {severity: critical}
        annotations:
          summary: "{{ $labels.device }} is at {{ $value }} °C, above -15 °C"
      - alert: FreezerDoorOpen
        expr: door_open > 0
        for: 10m
        labels: {severity: warning}
        annotations:
          summary: "{{ $labels.device }}'s door is open"
`), 0o644))
	cfg := newTestConfig(t)
	cfg.Alerting.Rules = ruleFile
	m := openRealClockService(t, cfg)
	base := "http://" + m.HTTPAddr()

	// An hour of readings every 30 s: freezer-1 warms from -20 °C to -3
	// °C over the last 20 minutes, its door open for the last 4; the
	// others stay cold and closed.
	now := time.Now().UTC().Truncate(time.Second)
	var rs []buckets.Reading
	for i := range 120 {
		ago := time.Duration(i) * 30 * time.Second
		k := buckets.MustTicks(now.Add(-ago))
		wobble := 0.4 * math.Sin(float64(i)/5)
		warm := -20.0
		if ago < 20*time.Minute {
			warm = -3 - 17*ago.Minutes()/20
		}
		rs = append(rs,
			newReading("freezer-1", k, buckets.Field{Name: "temp", Value: buckets.Float(math.Round((warm+wobble)*10) / 10)},
				buckets.Field{Name: "door_open", Value: buckets.Bool(ago < 4*time.Minute)}),
			newReading("freezer-2", k, buckets.Field{Name: "temp", Value: buckets.Float(math.Round((-21+wobble)*10) / 10)},
				buckets.Field{Name: "door_open", Value: buckets.Bool(false)}),
			newReading("freezer-3", k, buckets.Field{Name: "temp", Value: buckets.Float(math.Round((-18.5-wobble)*10) / 10)},
				buckets.Field{Name: "door_open", Value: buckets.Bool(false)}))
	}
	require.NoError(t, m.store.Write(context.Background(), rs))
	// The rule fires on the server before the page is opened.
	waitFor(t, 100*time.Millisecond, func() bool {
		st, _, ok := apiAlertOf(base, "FreezerWarm")
		return ok && st == "firing"
	}, "FreezerWarm never fired")

	screenshot := func(name string) {
		t.Helper()
		uiScreenshot(ctx, t, name)
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return s
	}
	rows := func(sel string) []string {
		t.Helper()
		out, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](fmt.Sprintf(
			`[...document.querySelectorAll(%q)].filter(r => r.offsetParent !== null).map(r => r.dataset.state + " " + r.dataset.alert + " " + r.dataset.device)`, sel)))
		require.NoError(t, err)
		return out
	}

	// The device list with the alerts box above it.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#alerts tr[data-alert="FreezerWarm"][data-state="firing"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#devices tbody tr[data-device="freezer-3"]`))))
	assert.Equal(t, "1 firing, 1 pending · 2 alerting rules", text(`#alerts .count`))
	assert.Equal(t, []string{"firing FreezerWarm freezer-1", "pending FreezerDoorOpen freezer-1"}, rows(`#alerts tr.alert`),
		"firing first, then pending")
	firing := text(`#alerts tr[data-alert="FreezerWarm"]`)
	for _, want := range []string{"critical", "freezer-1 is at -3 °C, above -15 °C", "active "} {
		assert.Contains(t, firing, want)
	}
	pending := text(`#alerts tr[data-alert="FreezerDoorOpen"]`)
	for _, want := range []string{"warning", "freezer-1's door is open", " of 10 min"} {
		assert.Contains(t, pending, want)
	}
	assert.Equal(t, "-3", text(`#alerts tr[data-alert="FreezerWarm"] td.value`))
	assert.Equal(t, "1", text(`#alerts tr[data-alert="FreezerDoorOpen"] td.value`))
	assert.Equal(t, "freezer-1 FreezerWarm FreezerDoorOpen", strings.Join(strings.Fields(text(`#devices tr[data-device="freezer-1"] td:first-child`)), " "),
		"the warm freezer's row names its alerts")
	assert.Equal(t, "freezer-2", strings.TrimSpace(text(`#devices tr[data-device="freezer-2"] td:first-child`)))
	screenshot("alerts.png")

	// The warm freezer's page: its alerts above its charts.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#alerts tr[data-alert="FreezerWarm"] a[href="#/device/freezer-1"]`))))
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](
		`document.querySelector('#device-title').textContent === 'freezer-1' &&
			!document.querySelector('#device-alerts').hidden &&
			document.querySelectorAll('#charts .chart[data-points]').length === 2`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.Sleep(300*time.Millisecond)))
	assert.Equal(t, []string{"firing FreezerWarm freezer-1", "pending FreezerDoorOpen freezer-1"}, rows(`#device-alerts tr.alert`))
	assert.Contains(t, text(`#device-alerts`), "freezer-1 is at -3")
	screenshot("device-alerts.png")

	// A quiet freezer's page has none.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/ui/#/device/freezer-2")))
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](
		`document.querySelector('#device-title').textContent === 'freezer-2' &&
			document.querySelectorAll('#charts .chart[data-points]').length === 2`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err)
	hidden, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#device-alerts').hidden`))
	require.NoError(t, err)
	assert.True(t, hidden, "freezer-2 has no alerts")
}
