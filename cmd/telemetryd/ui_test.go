package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
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
	Name     string `json:"name"`
	Points   int    `json:"points"`
	Isolated int    `json:"isolated"`
	Window   string `json:"window"`
	Src      string `json:"src"`
	Blue     int    `json:"blue"`  // canvas pixels drawn in the avg series' blue (#2962ff), not the faint band
	Empty    string `json:"empty"` // the "no data" message when shown
}

const chartsJS = `[...document.querySelectorAll('#charts .chart')].map(c => {
  const cv = c.querySelector('canvas');
  let blue = 0;
  if (cv) {
    const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i+3] > 100 && d[i+2] > d[i] + 80 && d[i+2] > d[i+1] + 50) blue++;
    }
  }
  const e = c.querySelector('.empty');
  return {name: c.dataset.name, points: +c.dataset.points, isolated: +c.dataset.isolated, window: c.dataset.window,
    src: c.dataset.src, blue, empty: e && !e.hidden ? e.textContent : ''};
})`

// newBrowser starts headless Chromium; requests returns the URLs and
// Authorization headers of the requests the page made so far.
func newBrowser(t *testing.T) (ctx context.Context, requests func() []pageRequest) {
	t.Helper()
	chrome := chromiumPath(t)
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
		chromedp.WindowSize(1280, 800),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelA)
	bctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(cancelB)
	var mu sync.Mutex
	var reqs []pageRequest
	require.NoError(t, chromedp.Listen(bctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			authz, _ := e.Request.Headers["Authorization"].(string)
			mu.Lock()
			reqs = append(reqs, pageRequest{URL: e.Request.URL, Authorization: authz})
			mu.Unlock()
		}
	}))
	require.NoError(t, chromedp.Do(bctx)) // starts the browser; later steps get a deadline
	ctx, cancelT := context.WithTimeout(bctx, 2*time.Minute)
	t.Cleanup(cancelT)
	return ctx, func() []pageRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]pageRequest(nil), reqs...)
	}
}

// pageRequest is one request the page made.
type pageRequest struct{ URL, Authorization string }

// TestUIInChromium opens /ui/ in headless Chromium: the device list
// shows the devices, the device view draws a chart with data points
// for each numeric value, and switching 1h -> 24h makes a new
// aggregates request. TELEMETRY_UI_SCREENSHOT=FILE saves a PNG of the
// device view there (the README's screenshot).
func TestUIInChromium(t *testing.T) {
	ctx, reqs := newBrowser(t)
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
	requests := func() []string {
		var out []string
		for _, r := range reqs() {
			if strings.Contains(r.URL, "/aggregates") {
				out = append(out, r.URL)
			}
		}
		return out
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
		assert.Greater(t, c.Blue, 500, "%s: the avg line is drawn", c.Name)
		assert.Zero(t, c.Isolated, "%s: a reading every 30 s fills every third 10 s bucket, and the line joins them", c.Name)
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
		assert.Greater(t, c.Blue, 500, c.Name)
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

// openRealClockService starts a service on the real clock (the page's
// windows end at the browser's now) and closes it at cleanup.
func openRealClockService(t *testing.T, cfg Config) *Main {
	t.Helper()
	return openMain(t, cfg, testLogWriter(t), nil)
}

// TestUISignInInChromium drives the page of a service with an auth
// file: the page and its files load without a token and show the
// sign-in form; a wrong token says so; a read token (kept in
// sessionStorage only, sent as Authorization: Bearer) shows the device
// list and charts. It also checks what the charts show for sparse data:
// a device sending once a minute is a line at 1h, a few minutes of data
// are dots at 7d, a window without data says so, a device with only
// text values lists them, and an unknown device has a page of its own.
// TELEMETRY_UI_SCREENSHOTS=DIR writes signin-wrong-token.png,
// devices.png, once-a-minute-1h.png and text-only.png there (the
// README's screenshots).
func TestUISignInInChromium(t *testing.T) {
	ctx, reqs := newBrowser(t)
	f := newAuthFixture(t, nil, "reader:read", "metrics:metrics")
	cfg := newTestConfig(t)
	cfg.Security.AuthFile = f.path
	m := openRealClockService(t, cfg)
	base := "http://" + m.HTTPAddr()

	now := time.Now().UTC()
	var rs []buckets.Reading
	at := func(d time.Duration) buckets.Ticks { return buckets.MustTicks(now.Add(-d).Truncate(time.Second)) }
	for i := range 6 * 60 { // greenhouse-1: every 30 s for 3 hours
		ts := now.Add(-time.Duration(i) * 30 * time.Second)
		h := float64(ts.Unix()%86400) / 86400 * 2 * math.Pi
		rs = append(rs, newReading("greenhouse-1", at(time.Duration(i)*30*time.Second),
			buckets.Field{Name: "temp", Value: buckets.Float(math.Round((21+4*math.Sin(h*6)+0.3*math.Sin(float64(i)/7))*100) / 100)},
			buckets.Field{Name: "firmware", Value: buckets.String("1.4.2")}))
	}
	for i := range 55 { // meter-07: once a minute for 55 minutes
		rs = append(rs, newReading("meter-07", at(time.Duration(i)*time.Minute+17*time.Second),
			buckets.Field{Name: "power", Value: buckets.Float(math.Round((230+20*math.Sin(float64(i)/6))*10) / 10)}))
	}
	// pump-2: four readings a few minutes apart, all in the last whole
	// 15-minute bucket (the 7d view's interval), so whatever the clock
	// says they are one bucket there.
	bucket := now.Truncate(15 * time.Minute).Add(-15 * time.Minute)
	for i := range 4 {
		rs = append(rs, newReading("pump-2", buckets.MustTicks(bucket.Add(time.Duration(i+1)*time.Minute)),
			buckets.Field{Name: "flow", Value: buckets.Float(float64(12 + i))}))
	}
	rs = append(rs, newReading("old-sensor", at(50*time.Hour), buckets.Field{Name: "temp", Value: buckets.Float(4.5)}))
	rs = append(rs, newReading("gateway-3", at(2*time.Minute), // text values only
		buckets.Field{Name: "firmware", Value: buckets.String("2.1.0")},
		buckets.Field{Name: "site", Value: buckets.String("north-field")},
		buckets.Field{Name: "state", Value: buckets.String("online")}))
	require.NoError(t, m.store.Write(context.Background(), rs))

	dir := os.Getenv("TELEMETRY_UI_SCREENSHOTS")
	screenshot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.Greater(t, len(png), 10000)
		if dir != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
			t.Logf("screenshot: %s", filepath.Join(dir, name))
		}
	}
	visible := func(sel string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(sel))), sel)
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return s
	}
	eval := func(js string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		require.NoError(t, err, js)
		return s
	}
	signIn := func(token string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx,
			chromedp.WaitVisible(chromedp.CSS(`#token`)),
			chromedp.SendKeys(chromedp.CSS(`#token`), token),
			chromedp.Click(chromedp.CSS(`#signin button[type="submit"]`))))
	}
	var charts []chartState
	waitCharts := func(dev, window string, n int) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/ui/#/device/"+dev+"?w="+window)))
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](
			fmt.Sprintf(`document.querySelector('#device-title').textContent === %q &&
				document.querySelectorAll('#charts .chart[data-window="%s"][data-points]').length === %d`, dev, window, n),
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "%s at %s", dev, window)
		require.NoError(t, chromedp.Do(ctx, chromedp.Sleep(300*time.Millisecond)))
		charts, err = chromedp.Run(ctx, chromedp.Evaluate[[]chartState](chartsJS))
		require.NoError(t, err)
		require.Len(t, charts, n)
	}

	// "/" leads to the page, which loads without a token and asks for one.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/")))
	visible(`#signin`)
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	assert.Equal(t, base+"/ui/", loc)
	assert.Empty(t, eval(`document.querySelector('#signin-error').hidden ? '' : 'shown'`), "no error before a token was given")

	// A wrong token: a clear message, and it is not kept.
	signIn("not-a-token-0123456789")
	visible(`#signin-error`)
	assert.Contains(t, text(`#signin-error`), "token was not accepted")
	assert.Empty(t, eval(`sessionStorage.getItem('telemetryd.token') || ''`))
	screenshot("signin-wrong-token.png")

	// The read token: the device list.
	signIn(f.tokens["reader"])
	visible(`#devices tbody tr[data-device="meter-07"]`)
	list := text(`#devices tbody`)
	for _, want := range []string{"greenhouse-1", "meter-07", "pump-2", "gateway-3", "old-sensor", "power=", "state=\"online\""} {
		assert.Contains(t, list, want)
	}
	assert.Equal(t, f.tokens["reader"], eval(`sessionStorage.getItem('telemetryd.token') || ''`), "kept for the tab")
	assert.Empty(t, eval(`localStorage.length ? 'used' : ''`), "nothing in localStorage")
	assert.Empty(t, eval(`document.cookie`), "no cookie")
	var sawBearer bool
	for _, r := range reqs() {
		assert.NotContains(t, r.URL, f.tokens["reader"], "the token is never in a URL")
		if strings.Contains(r.URL, "/v1/devices") && r.Authorization == "Bearer "+f.tokens["reader"] {
			sawBearer = true
		}
	}
	assert.True(t, sawBearer, "the page sends the token as Authorization: Bearer")
	screenshot("devices.png")

	// Once a minute at 1h (10 s buckets): a line, not an empty chart.
	waitCharts("meter-07", "1h", 1)
	assert.InDelta(t, 55, charts[0].Points, 1)
	assert.Zero(t, charts[0].Isolated, "the readings a minute apart are joined")
	assert.Greater(t, charts[0].Blue, 300, "the line is drawn")
	assert.Empty(t, charts[0].Empty)
	screenshot("once-a-minute-1h.png")

	// A few minutes of data at 7d (15 min buckets): a dot.
	waitCharts("pump-2", "7d", 1)
	assert.Equal(t, 1, charts[0].Points)
	assert.Equal(t, 1, charts[0].Isolated)
	assert.Positive(t, charts[0].Blue, "the lone bucket is drawn as a dot")
	waitCharts("pump-2", "30d", 1)
	assert.Positive(t, charts[0].Blue)

	// Nothing in the window: it says so.
	waitCharts("old-sensor", "1h", 1)
	assert.Zero(t, charts[0].Points)
	assert.Zero(t, charts[0].Blue)
	assert.Contains(t, charts[0].Empty, "No data in this window")
	waitCharts("old-sensor", "7d", 1)
	assert.Equal(t, 1, charts[0].Points)
	assert.Empty(t, charts[0].Empty)

	// Text values only: no charts, the values listed.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/ui/#/device/gateway-3")))
	visible(`#text-values tr[data-name="state"]`)
	assert.Contains(t, text(`#no-values`), "no numeric values")
	values := text(`#text-values tbody`)
	for _, want := range []string{"firmware", "2.1.0", "site", "north-field", "state", "online"} {
		assert.Contains(t, values, want)
	}
	assert.Equal(t, "0", eval(`String(document.querySelectorAll('#charts .chart').length)`))
	screenshot("text-only.png")

	// An unknown device: a page that says so.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/ui/#/device/no-such-device")))
	visible(`#unknown-view`)
	assert.Contains(t, text(`#unknown-text`), "no-such-device")
	assert.Equal(t, "true", eval(`String(document.querySelector('#device-view').hidden)`))
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/ui/#/device/a.b")))
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector('#unknown-text').textContent.includes('a.b')`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err)
	assert.Contains(t, text(`#unknown-text`), "is not a device ID")

	// Signing out forgets the token.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#signout`))))
	visible(`#signin`)
	assert.Empty(t, eval(`sessionStorage.getItem('telemetryd.token') || ''`))
}
