package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go/jetstream"
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
	Blue     int    `json:"blue"`   // canvas pixels drawn in the avg series' blue (#2962ff), not the faint band
	Empty    string `json:"empty"`  // the "no data" message when shown
	Legend   string `json:"legend"` // the line under the chart
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
    src: c.dataset.src, blue, empty: e && !e.hidden ? e.textContent : '', legend: (c.querySelector('.legend') || {}).textContent || ''};
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
// shows the devices, the device view lists the device's attributes and
// draws a chart with data points for each numeric value, and switching
// 1h -> 24h makes a new aggregates request. TELEMETRY_UI_SCREENSHOT=FILE saves a PNG of the
// device view there (the README's screenshot).
func TestUIInChromium(t *testing.T) {
	inLane(t, lanes.chromium)
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
	site, vs := buckets.NewAttributes(map[string]string{"site": "north-field", "crop": "tomato", "house": "1"})
	require.Nil(t, vs)
	require.NoError(t, env.st.Assign(context.Background(), []buckets.Assignment{
		{Device: "greenhouse-1", At: buckets.MustTicks(now), Set: site}}))
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
	noAlerts, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#alerts').hidden`))
	require.NoError(t, err)
	assert.True(t, noAlerts, "without alerting rules the page shows no alerts box")

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
	attrs, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#device-attrs li.attr')].map(li => li.textContent)`))
	require.NoError(t, err)
	assert.Equal(t, []string{"crop=tomato", "house=1", "site=north-field"}, attrs, "the device's attributes above its charts")
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
// a device sending once a minute is a line at 1h whose legend shows the
// last value, a few minutes of data at 7d get an axis fitted to them, a window without data says so, a device with only
// text values lists them, and an unknown device has a page of its own.
// TELEMETRY_UI_SCREENSHOTS=DIR writes signin-wrong-token.png,
// once-a-minute-1h.png and text-only.png there (the README's
// screenshots; TestUIAttributesInChromium writes the device list's).
func TestUISignInInChromium(t *testing.T) {
	inLane(t, lanes.chromium)
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

	screenshot := func(name string) {
		t.Helper()
		uiScreenshot(ctx, t, name)
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

	// Once a minute at 1h (10 s buckets): a line, not an empty chart.
	waitCharts("meter-07", "1h", 1)
	assert.InDelta(t, 55, charts[0].Points, 1)
	assert.Zero(t, charts[0].Isolated, "the readings a minute apart are joined")
	assert.Greater(t, charts[0].Blue, 300, "the line is drawn")
	assert.Empty(t, charts[0].Empty)
	assert.Equal(t, "last 230 at "+now.Add(-17*time.Second).Truncate(time.Second).Local().Format("3:04:05 PM"), charts[0].Legend,
		"the legend shows the last value without hovering")
	screenshot("once-a-minute-1h.png")

	// A few minutes of data at 7d (15 min buckets): the axis fitted to
	// them, in buckets fine enough to tell the four readings apart.
	waitCharts("pump-2", "7d", 1)
	assert.Equal(t, 4, charts[0].Points)
	assert.NotContains(t, charts[0].Src, "interval=15m")
	assert.Positive(t, charts[0].Blue)
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

// uiRow is what the device list shows for one device.
type uiRow struct {
	Device string   `json:"device"`
	Silent bool     `json:"silent"` // the row's class
	Label  string   `json:"label"`  // the visible label beside last seen
	Seen   string   `json:"seen"`
	Attrs  []string `json:"attrs"`
	More   string   `json:"more"`
}

const rowsJS = `[...document.querySelectorAll('#devices tbody tr')].map(tr => {
  const b = tr.querySelector('.silent-badge');
  const more = tr.querySelector('li.attr.more');
  return {device: tr.dataset.device, silent: tr.classList.contains('silent'),
    label: b && b.offsetParent !== null ? b.textContent : '', seen: tr.querySelector('td.seen').textContent,
    attrs: [...tr.querySelectorAll('li.attr:not(.more)')].map(li => li.textContent), more: more ? more.textContent : ''};
})`

// TestUIAttributesInChromium drives the device list of a service with
// an auth file on the real clock: six devices send readings over NATS
// with their own credentials, a write token gives five of them
// attributes with PUT /v1/devices/{device}/attributes (fleets East and
// West) and one more device that has sent nothing, and two went silent
// (40 min and 3 h ago). After signing in with a read token the page
// shows each device's attributes and marks the silent ones with a class
// and a visible "silent" label, for how long and the threshold (the
// device without readings is not silent: it shows "no readings yet"). The
// attribute filter fleet=East is sent as match={fleet="East"} and lists
// exactly the East devices; clicking an attribute adds it to the
// filter; a matcher the server refuses shows the server's message;
// "silent only" sends silent_for=; a changed silence threshold re-marks
// the list and is remembered in localStorage; the device view lists the
// device's attributes beside its charts. TELEMETRY_UI_SCREENSHOTS=DIR
// writes devices.png (the list filtered by fleet) and
// device-attributes.png there (the README's screenshots).
func TestUIAttributesInChromium(t *testing.T) {
	inLane(t, lanes.chromium)
	ctx, reqs := newBrowser(t)
	devs := []string{"pump-9", "truck-1", "truck-2", "truck-3", "van-1", "van-2"}
	f := newAuthFixture(t, devs, "reader:read", "fleetops:write")
	cfg := newTestConfig(t)
	cfg.Security.AuthFile = f.path
	m := openRealClockService(t, cfg)
	base := "http://" + m.HTTPAddr()
	send := func(method, path, token, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	waitFor(t, 20*time.Millisecond, func() bool {
		code, _ := send(http.MethodGet, "/readyz", "", "")
		return code == http.StatusOK
	}, "service never became ready")

	// Each device sends an hour of readings, once a minute, up to its
	// last reading: now for four of them, 40 min and 3 h ago for the
	// silent two.
	now := time.Now().UTC().Truncate(time.Second)
	silentFor := map[string]time.Duration{"truck-3": 40 * time.Minute, "van-2": 3 * time.Hour}
	for di, dev := range devs {
		nc, _, err := deviceConn(m.NATSURL(), dev, f.devices[dev])
		require.NoError(t, err)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		var b strings.Builder
		b.WriteByte('[')
		for j := range 60 {
			if j > 0 {
				b.WriteByte(',')
			}
			ts := now.Add(-silentFor[dev] - time.Duration(59-j)*time.Minute)
			fmt.Fprintf(&b, `{"ts":%d,"speed":%.1f,"fuel":%d}`, ts.UnixMilli(),
				math.Round((50+20*math.Sin(float64(j+di*7)/8))*10)/10, 90-j/2-di*5)
		}
		b.WriteByte(']')
		pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = js.Publish(pctx, cfg.SubjectPrefix+"."+dev, []byte(b.String()))
		cancel()
		nc.Close()
		require.NoError(t, err, dev)
	}
	waitFor(t, 50*time.Millisecond, func() bool {
		var l struct {
			Devices []struct {
				Device   string    `json:"device"`
				LastSeen time.Time `json:"lastSeen"`
			} `json:"devices"`
		}
		code, body := send(http.MethodGet, "/v1/devices", f.tokens["reader"], "")
		if code != http.StatusOK || json.Unmarshal([]byte(body), &l) != nil || len(l.Devices) != len(devs) {
			return false
		}
		for _, d := range l.Devices {
			if !d.LastSeen.Equal(now.Add(-silentFor[d.Device])) {
				return false
			}
		}
		return true
	}, "the readings were never stored")

	// The attributes, set as an operator would.
	attrs := map[string]map[string]string{
		"truck-1": {"fleet": "East", "model": "F-150", "depot": "Boston", "driver": "ana", "year": "2022",
			"fuel_type": "diesel", "color": "white", "tier": "gold"},
		"truck-2": {"fleet": "East", "model": "F-250", "depot": "Boston"},
		"truck-3": {"fleet": "East", "model": "F-150", "depot": "Albany"},
		"van-1":   {"fleet": "West", "model": "Sprinter", "depot": "Fresno"},
		"van-2":   {"fleet": "West", "model": "Transit", "depot": "Reno"},
		// Known by its attributes only: it has sent no reading.
		"trailer-1": {"depot": "Reno"},
	}
	for dev, a := range attrs {
		b, err := json.Marshal(a)
		require.NoError(t, err)
		code, body := send(http.MethodPut, "/v1/devices/"+dev+"/attributes", f.tokens["fleetops"], string(b))
		require.Equal(t, http.StatusOK, code, "PUT attributes of %s: %s", dev, body)
	}

	screenshot := func(name string) {
		t.Helper()
		uiScreenshot(ctx, t, name)
	}
	eval := func(js string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		require.NoError(t, err, js)
		return s
	}
	// waitList waits until the list shows exactly want (in order) and
	// returns its rows.
	waitList := func(want ...string) []uiRow {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](
			fmt.Sprintf(`!document.querySelector('#devices-view').hidden && !document.querySelector('#devices').hidden &&
				[...document.querySelectorAll('#devices tbody tr')].map(tr => tr.dataset.device).join(',') === %q`, strings.Join(want, ",")),
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "the list never showed exactly %v; it shows %s", want,
			eval(`[...document.querySelectorAll('#devices tbody tr')].map(tr => tr.dataset.device).join(',')`))
		rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]uiRow](rowsJS))
		require.NoError(t, err)
		return rows
	}
	silentOf := func(rows []uiRow) []string {
		var out []string
		for _, r := range rows {
			if r.Silent {
				out = append(out, r.Device)
				assert.Equal(t, "silent", r.Label, "%s: a visible label, not the colour alone", r.Device)
			} else {
				assert.Empty(t, r.Label, r.Device)
			}
		}
		return out
	}
	// lastList is the query of the page's last GET /v1/devices.
	lastList := func() url.Values {
		t.Helper()
		var last string
		for _, r := range reqs() {
			if strings.Contains(r.URL, "/v1/devices?") {
				last = r.URL
			}
		}
		require.NotEmpty(t, last)
		u, err := url.Parse(last)
		require.NoError(t, err)
		return u.Query()
	}
	filter := func(text string) {
		t.Helper()
		eval(`document.querySelector('#match').value = ''`)
		require.NoError(t, chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS(`#match`), text),
			chromedp.Click(chromedp.CSS(`#match-form button[type="submit"]`))))
	}

	// Every device, with its attributes; the two silent ones marked.
	all := []string{"pump-9", "trailer-1", "truck-1", "truck-2", "truck-3", "van-1", "van-2"}
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), f.tokens["reader"]),
		chromedp.Click(chromedp.CSS(`#signin button[type="submit"]`))))
	rows := waitList(all...)
	assert.Equal(t, []string{"truck-3", "van-2"}, silentOf(rows))
	byDev := map[string]uiRow{}
	for _, r := range rows {
		byDev[r.Device] = r
	}
	assert.Empty(t, byDev["pump-9"].Attrs)
	assert.Equal(t, []string{"depot=Boston", "fleet=East", "model=F-250"}, byDev["truck-2"].Attrs)
	assert.Equal(t, []string{"depot=Reno", "fleet=West", "model=Transit"}, byDev["van-2"].Attrs)
	assert.Len(t, byDev["truck-1"].Attrs, 5, "eight attributes are shown compactly: five and a count")
	assert.Equal(t, "+3 more", byDev["truck-1"].More)
	assert.Equal(t, "silent 3 h (threshold 10 min)", byDev["van-2"].Seen, "for how long, against which threshold")
	assert.Equal(t, "no readings yet", byDev["trailer-1"].Seen, "never silent")
	assert.Contains(t, eval(`document.querySelector('#device-count').textContent`), "7 devices, 2 silent")

	// fleet=East is sent as match={fleet="East"}: exactly the East
	// devices, the silent one marked.
	filter("fleet=East")
	rows = waitList("truck-1", "truck-2", "truck-3")
	assert.Equal(t, []string{"truck-3"}, silentOf(rows))
	assert.Equal(t, `{fleet="East"}`, lastList().Get("match"))
	assert.Contains(t, eval(`location.hash`), "match=fleet%3DEast", "the filter is in the page's address")
	for _, r := range rows {
		assert.Contains(t, r.Attrs, "fleet=East", r.Device)
	}
	screenshot("devices.png")

	// An attribute in the list is a button that adds it to the filter.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#devices tr[data-device="truck-3"] li.attr[data-name="model"] button`))))
	waitList("truck-1", "truck-3")
	assert.Equal(t, `{fleet="East",model="F-150"}`, lastList().Get("match"))
	assert.Equal(t, "fleet=East, model=F-150", eval(`document.querySelector('#match').value`))

	// Prometheus syntax as it is, and several matchers.
	filter(`{fleet="West"}`)
	rows = waitList("van-1", "van-2")
	assert.Equal(t, []string{"van-2"}, silentOf(rows))
	assert.Equal(t, `{fleet="West"}`, lastList().Get("match"))
	filter(`fleet!=West, model=~F-1.*`)
	waitList("truck-1", "truck-3")
	assert.Equal(t, `{fleet!="West",model=~"F-1.*"}`, lastList().Get("match"))

	// A matcher the server refuses: its message, and no list.
	filter(`model=~F-(`)
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](`!document.querySelector('#match-error').hidden`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err)
	code, body := send(http.MethodGet, "/v1/devices?match="+url.QueryEscape(`{model=~"F-("}`), f.tokens["reader"], "")
	require.Equal(t, http.StatusBadRequest, code, body)
	var apiErr struct {
		Error struct{ Message string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &apiErr))
	require.NotEmpty(t, apiErr.Error.Message)
	msg := eval(`document.querySelector('#match-error').textContent`)
	assert.Contains(t, msg, apiErr.Error.Message, "the server's own words")
	assert.Contains(t, msg, `{model=~"F-("}`)
	assert.Contains(t, msg, "400")
	assert.Equal(t, "true", eval(`String(document.querySelector('#devices').hidden)`))
	assert.Equal(t, "true", eval(`document.querySelector('#match').getAttribute('aria-invalid') || ''`))

	// Silent only: silent_for= with the threshold, combined with the filter.
	filter("fleet=East")
	waitList("truck-1", "truck-2", "truck-3")
	assert.Equal(t, "true", eval(`String(document.querySelector('#match-error').hidden)`))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#silent-only`))))
	rows = waitList("truck-3")
	assert.Equal(t, []string{"truck-3"}, silentOf(rows))
	assert.Equal(t, "10m", lastList().Get("silent_for"))
	assert.Equal(t, `{fleet="East"}`, lastList().Get("match"))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#silent-only`))))
	waitList("truck-1", "truck-2", "truck-3")
	assert.Empty(t, lastList().Get("silent_for"))

	// A longer threshold: 40 minutes without a reading is no longer
	// silent; the choice outlives a reload.
	assert.Equal(t, "600", eval(`document.querySelector('#silence').value`), "10 minutes by default")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/ui/#/")))
	waitList(all...)
	setSilence := func(sec string) {
		t.Helper()
		eval(`(() => { const s = document.querySelector('#silence'); s.value = '` + sec + `';
			s.dispatchEvent(new Event('change')); return ''; })()`)
	}
	setSilence("3600")
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelectorAll('#devices tbody tr.silent').length === 1`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err)
	assert.Equal(t, []string{"van-2"}, silentOf(waitList(all...)))
	assert.Equal(t, "3600", eval(`localStorage.getItem('telemetryd.silence') || ''`))
	require.NoError(t, chromedp.Do(ctx, chromedp.Reload()))
	rows = waitList(all...)
	assert.Equal(t, "3600", eval(`document.querySelector('#silence').value`))
	assert.Equal(t, []string{"van-2"}, silentOf(rows))
	setSilence("600")
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelectorAll('#devices tbody tr.silent').length === 2`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err)

	// The device view: the attributes beside the charts.
	deviceView := func(dev string) (attrs []string, silent string) {
		t.Helper()
		if !strings.HasSuffix(eval(`location.hash`), "/device/"+dev) {
			require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/ui/#/device/"+dev)))
		}
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](
			fmt.Sprintf(`document.querySelector('#device-title').textContent === %q &&
				document.querySelectorAll('#device-attrs li.attr').length > 0 &&
				document.querySelectorAll('#charts .chart[data-points]').length === 2`, dev),
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, dev)
		attrs, err = chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#device-attrs li.attr')].map(li => li.textContent)`))
		require.NoError(t, err)
		return attrs, eval(`(b => b.offsetParent !== null ? b.textContent : '')(document.querySelector('#device-silent'))`)
	}
	got, silent := deviceView("truck-1")
	assert.Equal(t, []string{"color=white", "depot=Boston", "driver=ana", "fleet=East", "fuel_type=diesel", "model=F-150", "tier=gold", "year=2022"}, got,
		"the device view lists every attribute")
	assert.Empty(t, silent)

	// From the filtered list (its address) to a device and back.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/ui/#/?match="+url.QueryEscape("fleet=East"))))
	waitList("truck-1", "truck-2", "truck-3")
	assert.Equal(t, "fleet=East", eval(`document.querySelector('#match').value`))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#devices a[href="#/device/truck-3"]`))))
	got, silent = deviceView("truck-3")
	assert.Equal(t, []string{"depot=Albany", "fleet=East", "model=F-150"}, got)
	// Silent since its last reading, 40 min before now was taken: more
	// by the time the test has run since, in whole minutes down or up.
	ran := int(time.Since(now) / time.Minute)
	assert.Contains(t, []string{fmt.Sprintf("silent %d min (threshold 10 min)", 40+ran), fmt.Sprintf("silent %d min (threshold 10 min)", 41+ran)}, silent)
	charts, err := chromedp.Run(ctx, chromedp.Evaluate[[]chartState](chartsJS))
	require.NoError(t, err)
	for _, c := range charts {
		assert.Positive(t, c.Points, c.Name)
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.Sleep(300*time.Millisecond)))
	screenshot("device-attributes.png")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#back`))))
	waitList("truck-1", "truck-2", "truck-3")
	assert.Equal(t, "fleet=East", eval(`document.querySelector('#match').value`), "back to the filtered list")
	for _, r := range reqs() {
		assert.NotContains(t, r.URL, f.tokens["reader"], "the token is never in a URL")
	}
}

// uiScreenshot takes a screenshot of the page ctx shows and, when
// TELEMETRY_UI_SCREENSHOTS names a folder, writes it there as name.
func uiScreenshot(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.Greater(t, len(png), 10000)
	if dir := os.Getenv("TELEMETRY_UI_SCREENSHOTS"); dir != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
		t.Logf("screenshot: %s", filepath.Join(dir, name))
	}
}
