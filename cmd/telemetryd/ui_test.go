package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// chromiumPath finds Debian's chromium; without it the test skips,
// unless CI is set, where it fails (.ci/run installs it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed (apt-get install -y chromium); CI is set, so this is a failure")
	}
	t.Skip("chromium is not installed (apt-get install -y chromium)")
	return ""
}

// chartState is what the page reports about one chart.
type chartState struct {
	Name   string `json:"name"`
	Points int    `json:"points"`
	Window string `json:"window"`
	Src    string `json:"src"`
	Inked  int    `json:"inked"` // canvas pixels that are not blank
}

const chartsJS = `[...document.querySelectorAll('#charts .chart')].map(c => {
  const cv = c.querySelector('canvas');
  let inked = 0;
  if (cv) {
    const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
    for (let i = 3; i < d.length; i += 4) if (d[i] > 0) inked++;
  }
  return {name: c.dataset.name, points: +c.dataset.points, window: c.dataset.window, src: c.dataset.src, inked};
})`

// TestUIInChromium opens /ui/ in headless Chromium: the device list
// shows the devices, the device view draws a chart with data points
// for each numeric value, and switching 1h -> 24h makes a new
// aggregates request. TELEMETRY_UI_SCREENSHOT=FILE saves a PNG of the
// device view there (the README's screenshot).
func TestUIInChromium(t *testing.T) {
	chrome := chromiumPath(t)
	now := time.Now().UTC()
	env := newDashEnv(t, now)

	// greenhouse-1: every 30 s for 26 hours; two more devices.
	var rs []buckets.Reading
	start := now.Add(-26 * time.Hour).Truncate(30 * time.Second)
	for i := 0; start.Add(time.Duration(i) * 30 * time.Second).Before(now); i++ {
		ts := start.Add(time.Duration(i) * 30 * time.Second)
		h := float64(ts.Unix()%86400) / 86400 * 2 * math.Pi
		rs = append(rs, newReading("greenhouse-1", buckets.MustTicks(ts),
			buckets.Field{Name: "temp", Value: buckets.Float(math.Round((21+4*math.Sin(h)+0.3*math.Sin(float64(i)/7))*100) / 100)},
			buckets.Field{Name: "humidity", Value: buckets.Int(int64(55 + 10*math.Cos(h)))},
			buckets.Field{Name: "door_open", Value: buckets.Bool(i%40 < 3)},
			buckets.Field{Name: "firmware", Value: buckets.String("1.4.2")}))
	}
	for _, dev := range []string{"pump-7", "meter_03"} {
		for j := range 30 {
			rs = append(rs, newReading(dev, buckets.MustTicks(now.Add(-time.Duration(j)*time.Minute)),
				buckets.Field{Name: "power", Value: buckets.Float(float64(100 + j))}))
		}
	}
	env.write(t, rs...)

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chrome),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	var mu sync.Mutex
	var aggRequests []string
	require.NoError(t, chromedp.Listen(bctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok && strings.Contains(e.Request.URL, "/aggregates") {
			mu.Lock()
			aggRequests = append(aggRequests, e.Request.URL)
			mu.Unlock()
		}
	}))
	require.NoError(t, chromedp.Do(bctx)) // starts the browser; later steps get a deadline
	ctx, cancelT := context.WithTimeout(bctx, 90*time.Second)
	defer cancelT()
	requests := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), aggRequests...)
	}

	// The device list.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(env.base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#devices tbody tr[data-device="pump-7"]`)),
	))
	listText, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#devices tbody`)))
	require.NoError(t, err)
	for _, want := range []string{"greenhouse-1", "pump-7", "meter_03", "temp=", "power=", "s ago"} {
		assert.Contains(t, listText, want)
	}

	// The device view at 1h: one chart per numeric value, each drawn.
	var charts []chartState
	waitCharts := func(window string) {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](
			fmt.Sprintf(`document.querySelectorAll('#charts .chart[data-window="%s"][data-points]').length === 3`, window),
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err)
		require.NoError(t, chromedp.Do(ctx, chromedp.Sleep(300*time.Millisecond)))
		charts, err = chromedp.Run(ctx, chromedp.Evaluate[[]chartState](chartsJS))
		require.NoError(t, err)
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#devices a[href="#/device/greenhouse-1"]`))))
	waitCharts("1h")
	require.Len(t, charts, 3)
	var names []string
	for _, c := range charts {
		names = append(names, c.Name)
		// 1h at 10 s buckets, a reading every 30 s: about 120 points.
		assert.InDelta(t, 120, c.Points, 3, c.Name)
		assert.Greater(t, c.Inked, 500, "%s: the chart canvas is drawn", c.Name)
		assert.Contains(t, c.Src, "interval=10s")
	}
	assert.Equal(t, []string{"door_open", "humidity", "temp"}, names, "strings are not charted")
	before := len(requests())
	require.Positive(t, before)
	assert.Contains(t, requests()[before-1], "interval=10s")

	// Switching to 24h asks for other buckets.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`.windows button[data-window="24h"]`))))
	waitCharts("24h")
	after := requests()
	require.Greater(t, len(after), before, "switching the window makes a new request")
	last := after[len(after)-1]
	assert.Contains(t, last, "interval=2m")
	assert.NotEqual(t, after[before-1], last)
	for _, c := range charts {
		assert.InDelta(t, 720, c.Points, 2, "%s: 24h at 2 min buckets", c.Name)
		assert.Greater(t, c.Inked, 500, c.Name)
	}

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.Greater(t, len(png), 10000)
	out := os.Getenv("TELEMETRY_UI_SCREENSHOT")
	if out == "" {
		out = t.TempDir() + "/ui.png"
	}
	require.NoError(t, os.WriteFile(out, png, 0o644))
	t.Logf("screenshot: %s", out)
}
