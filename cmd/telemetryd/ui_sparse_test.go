package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// sparseChart is what a user sees of one chart: its kind, the legend
// under it, and each marker drawn for a point, with the number of blue
// canvas pixels in the 9x9 box around it (a marker is about 40, a line
// passing through about 15, a one-pixel dot 1 or 2).
type sparseChart struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Points   int    `json:"points"`
	Isolated int    `json:"isolated"`
	Src      string `json:"src"`
	Fit      string `json:"fit"`
	Legend   string `json:"legend"`
	Markers  []struct {
		X    int `json:"x"`
		Y    int `json:"y"`
		Blue int `json:"blue"`
	} `json:"markers"`
}

const sparseJS = `[...document.querySelectorAll('#charts .chart')].map(c => {
  const cv = c.querySelector('canvas');
  const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
  const blueAt = (x, y) => {
    if (x < 0 || y < 0 || x >= cv.width || y >= cv.height) return 0;
    const i = (y * cv.width + x) * 4;
    return d[i+3] > 100 && d[i+2] > d[i] + 80 && d[i+2] > d[i+1] + 50 ? 1 : 0;
  };
  const markers = c.markers().map(m => {
    let blue = 0;
    for (let dy = -4; dy <= 4; dy++) for (let dx = -4; dx <= 4; dx++) blue += blueAt(m.x + dx, m.y + dy);
    return {x: m.x, y: m.y, blue};
  });
  return {name: c.dataset.name, kind: c.dataset.kind, points: +c.dataset.points, isolated: +c.dataset.isolated,
    src: c.dataset.src, fit: c.dataset.fit, legend: c.querySelector('.legend').textContent, markers};
})`

// TestUISparseDataInChromium opens /ui/ in headless Chromium with the
// data a first run gives, and checks that it reads well:
//
//   - ten seconds of readings in the 1h window: the time axis is fitted
//     to them (1 s buckets, a line saying so), every reading a visible
//     marker; asked for the whole hour, the two buckets are still
//     markers, not a one-pixel dot;
//   - one reading in the hour: a marker, and "One reading in the last
//     hour";
//   - a boolean and a state (a whole number with three values): step
//     lines, the boolean with false/true, no ramp between two readings;
//   - every legend shows the last value without hovering, and the
//     bucket's values when hovered;
//   - a silent device's row says for how long and against which
//     threshold: "silent 20 min (threshold 10 min)".
//
// TELEMETRY_UI_SCREENSHOTS=DIR writes sparse-10s-1h.png, boolean-1h.png
// and silent-devices.png there (the README's screenshots).
func TestUISparseDataInChromium(t *testing.T) {
	inLane(t, lanes.chromium)
	ctx, _ := newBrowser(t)
	now := time.Now().UTC().Truncate(time.Second)
	env := newDashEnv(t, now)
	at := func(d time.Duration) buckets.Ticks { return buckets.MustTicks(now.Add(-d)) }

	var rs []buckets.Reading
	// sim-0001: 25 readings 400 ms apart, for 10 s up to 15 s ago, as
	// the README's simulator run leaves them.
	for i := range 25 {
		rs = append(rs, newReading("sim-0001", at(15*time.Second+time.Duration(24-i)*400*time.Millisecond),
			buckets.Field{Name: "temp", Value: buckets.Float(20 + float64(i)/10)},
			buckets.Field{Name: "humidity", Value: buckets.Float(40 + float64(i%5))}))
	}
	// lonely-1: one reading, 20 minutes ago.
	rs = append(rs, newReading("lonely-1", at(20*time.Minute), buckets.Field{Name: "level", Value: buckets.Float(3.5)}))
	// door-4: every 2 min for an hour; the door open from 40 to 26 min
	// ago and from 6 to 2 min ago; mode 0, then 2 from 30 min ago, then
	// 1 from 10 min ago.
	open := func(ago time.Duration) bool {
		return (ago <= 40*time.Minute && ago > 26*time.Minute) || (ago <= 6*time.Minute && ago > 2*time.Minute)
	}
	for i := range 30 {
		ago := time.Duration(i) * 2 * time.Minute
		mode := int64(0)
		switch {
		case ago < 10*time.Minute:
			mode = 1
		case ago < 30*time.Minute:
			mode = 2
		}
		rs = append(rs, newReading("door-4", at(ago),
			buckets.Field{Name: "door_open", Value: buckets.Bool(open(ago))},
			buckets.Field{Name: "mode", Value: buckets.Int(mode)}))
	}
	// van-2: once a minute for an hour, up to 3 hours ago.
	for i := range 60 {
		rs = append(rs, newReading("van-2", at(3*time.Hour+time.Duration(i)*time.Minute),
			buckets.Field{Name: "speed", Value: buckets.Float(50 + float64(i%7))}))
	}
	env.write(t, rs...)

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
	var charts []sparseChart
	// wait waits until the device view shows n charts of dev drawn from
	// an aggregates request whose URL contains src, and reads them.
	wait := func(dev string, n int, src string) {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](
			fmt.Sprintf(`document.querySelector('#device-title').textContent === %q &&
				[...document.querySelectorAll('#charts .chart[data-points]')].filter(c => c.dataset.src.includes(%q) && c.querySelector('canvas')).length === %d`,
				dev, src, n),
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "%s: %d charts from %s", dev, n, src)
		require.NoError(t, chromedp.Do(ctx, chromedp.Sleep(300*time.Millisecond)))
		charts, err = chromedp.Run(ctx, chromedp.Evaluate[[]sparseChart](sparseJS))
		require.NoError(t, err)
		require.Len(t, charts, n)
	}
	show := func(dev string, n int, src string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(env.base+"/ui/#/device/"+dev+"?w=1h")))
		wait(dev, n, src)
	}
	visibleMarkers := func(c sparseChart) {
		t.Helper()
		require.NotEmpty(t, c.Markers, c.Name)
		for _, m := range c.Markers {
			assert.GreaterOrEqual(t, m.Blue, 25, "%s: the point at (%d,%d) is a marker, not a dot", c.Name, m.X, m.Y)
		}
	}
	clock := func(d time.Duration) string { // the page's time of day: en-US in headless Chromium
		return now.Add(-d).Local().Format("3:04:05 PM")
	}

	// The device list: the silent devices say for how long and against
	// which threshold.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(env.base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#devices tbody tr[data-device="van-2"]`))))
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]uiRow](rowsJS))
	require.NoError(t, err)
	seen := map[string]uiRow{}
	for _, r := range rows {
		seen[r.Device] = r
	}
	assert.Equal(t, "silent 20 min (threshold 10 min)", seen["lonely-1"].Seen)
	assert.Equal(t, "silent 3 h (threshold 10 min)", seen["van-2"].Seen)
	assert.Equal(t, "silent", seen["van-2"].Label)
	assert.True(t, seen["van-2"].Silent)
	assert.Regexp(t, `^\d+ s ago$`, seen["sim-0001"].Seen)
	assert.False(t, seen["sim-0001"].Silent)
	assert.Contains(t, eval(`document.querySelector('#device-count').textContent`), "4 devices, 2 silent for more than 10 min")
	assert.Contains(t, eval(`document.querySelector('#devices tr[data-device="van-2"] td.seen').title`), "10 min")
	screenshot("silent-devices.png")

	// Ten seconds of data in the last hour: the axis fitted to them, at
	// 1 s buckets, each reading a marker; the legend shows the last
	// value.
	show("sim-0001", 2, "interval=1s")
	assert.Contains(t, eval(`document.querySelector('#fit-text').textContent`), "Readings only in the last")
	assert.Contains(t, eval(`document.querySelector('#fit-text').textContent`), "of the last hour: the time axis is fitted to them.")
	for _, c := range charts {
		assert.Equal(t, "1", c.Fit, c.Name)
		assert.InDelta(t, 10, c.Points, 1, "%s: 10 s at 1 s buckets", c.Name)
		assert.Len(t, c.Markers, c.Points, "%s: few points, each marked", c.Name)
		visibleMarkers(c)
		assert.NotContains(t, c.Legend, "--", c.Name)
	}
	assert.Equal(t, "humidity", charts[0].Name)
	assert.Regexp(t, `^last 4\d at `, charts[0].Legend)
	assert.Equal(t, "last 22.4 at "+clock(15*time.Second), charts[1].Legend, "temp: the last reading's value and time")
	screenshot("sparse-10s-1h.png")

	// The whole hour, when asked: two 10 s buckets at the edge, both
	// markers.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#fit-toggle`))))
	wait("sim-0001", 2, "interval=10s")
	for _, c := range charts {
		assert.Empty(t, c.Fit)
		assert.LessOrEqual(t, c.Points, 3, c.Name)
		assert.Len(t, c.Markers, c.Points, c.Name)
		visibleMarkers(c)
	}
	assert.Contains(t, eval(`document.querySelector('#fit-toggle').textContent`), "fit the axis to the data")

	// One reading in the hour: a marker, fitted or not.
	show("lonely-1", 1, "interval=1s")
	assert.Contains(t, eval(`document.querySelector('#fit-text').textContent`), "One reading in the last hour, at "+clock(20*time.Minute))
	assert.Equal(t, 1, charts[0].Points)
	visibleMarkers(charts[0])
	assert.Equal(t, "last 3.5 at "+clock(20*time.Minute), charts[0].Legend)
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#fit-toggle`))))
	wait("lonely-1", 1, "interval=10s")
	assert.Equal(t, 1, charts[0].Isolated)
	require.Len(t, charts[0].Markers, 1)
	visibleMarkers(charts[0])

	// A boolean and a state: step lines.
	show("door-4", 2, "interval=10s")
	door, mode := charts[0], charts[1]
	require.Equal(t, "door_open", door.Name)
	assert.Equal(t, "bool", door.Kind)
	assert.Equal(t, "state", mode.Kind)
	assert.Empty(t, door.Fit)
	assert.Equal(t, "last false at "+clock(0), door.Legend)
	assert.Equal(t, "last 1 at "+clock(0), mode.Legend)
	assert.Equal(t, "true,false", eval(`(u => u.axes[1]._values.slice().reverse().join(','))(document.querySelector('.chart[data-name="door_open"]').uplot)`),
		"the boolean's axis reads false and true")
	// Between the closed reading 42 min ago and the open one 40 min ago
	// (in 10 s buckets) the line stays at false and then rises straight
	// up: half way nothing is drawn between the false and true levels (a
	// ramp would cross there), and the open span is a level line at
	// true.
	bucket := func(ago time.Duration) int64 { return now.Add(-ago).Truncate(10 * time.Second).Unix() }
	step, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]int](fmt.Sprintf(`(() => {
		const c = document.querySelector('.chart[data-name="door_open"]'), u = c.uplot, cv = c.querySelector('canvas');
		const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
		const blue = (x, y) => { const i = (y * cv.width + x) * 4; return d[i+3] > 100 && d[i+2] > d[i] + 80 && d[i+2] > d[i+1] + 50 ? 1 : 0; };
		const x = s => Math.round(u.valToPos(s, 'x', true)), y = v => Math.round(u.valToPos(v, 'y', true));
		let ramp = 0, level = 0;
		const mid = x(%d);
		for (let yy = y(0.8); yy <= y(0.2); yy++) for (let dx = -2; dx <= 2; dx++) ramp += blue(mid + dx, yy);
		for (let xx = x(%d); xx <= x(%d); xx++) for (let dy = -1; dy <= 1; dy++) level += blue(xx, y(1) + dy) ? 1 : 0;
		return {ramp, level, width: x(%d) - x(%d)};
	})()`, (bucket(42*time.Minute)+bucket(40*time.Minute))/2, bucket(40*time.Minute), bucket(26*time.Minute),
		bucket(26*time.Minute), bucket(40*time.Minute))))
	require.NoError(t, err)
	assert.LessOrEqual(t, step["ramp"], 2, "a step, not a ramp: %v", step)
	assert.GreaterOrEqual(t, step["level"], step["width"], "the open span is a line at true: %v", step)

	// Hovering shows the bucket under the cursor; leaving shows the last
	// value again.
	hover := func(name string, ago time.Duration) string {
		t.Helper()
		pos, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]float64](fmt.Sprintf(`(() => {
			const u = document.querySelector('.chart[data-name=%q]').uplot, r = u.over.getBoundingClientRect();
			return {x: r.left + u.valToPos(%d, 'x'), y: r.top + r.height / 2};
		})()`, name, now.Add(-ago).Unix())))
		require.NoError(t, err)
		require.NoError(t, chromedp.Do(ctx, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, pos["x"], pos["y"])))
		_, err = chromedp.Run(ctx, chromedp.Poll[bool](
			fmt.Sprintf(`document.querySelector('.chart[data-name=%q] .legend').classList.contains('hover')`, name),
			chromedp.WithPollingTimeout(10*time.Second)))
		require.NoError(t, err)
		return eval(fmt.Sprintf(`document.querySelector('.chart[data-name=%q] .legend').textContent`, name))
	}
	assert.Equal(t, now.Add(-30*time.Minute).Truncate(10*time.Second).Local().Format("3:04:05 PM")+": true (true in 1 of 1 reading)", hover("door_open", 30*time.Minute),
		"hovered: the 10 s bucket under the cursor")
	screenshot("boolean-1h.png")
	require.NoError(t, chromedp.Do(ctx, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, 5, 5)))
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](
		`document.querySelector('.chart[data-name="door_open"] .legend').textContent.startsWith('last ')`,
		chromedp.WithPollingTimeout(10*time.Second)))
	require.NoError(t, err, "the legend goes back to the last value")
	assert.True(t, strings.HasPrefix(eval(`document.querySelector('.chart[data-name="mode"] .legend').textContent`), "last 1 at"))
}
