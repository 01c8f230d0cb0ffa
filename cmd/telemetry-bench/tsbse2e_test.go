package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest"
)

// tsbsT0 is the first time of the test files (TSBS's own start time).
var tsbsT0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

// writeTSBSFile writes a TSBS IoT shaped file: trucks trucks, times
// times 10 s apart, a "readings" and a "diagnostics" line per truck and
// time; extra lines are appended as they are.
func writeTSBSFile(t *testing.T, trucks, times int, extra ...string) string {
	var b strings.Builder
	for i := range times {
		ns := tsbsT0.Add(time.Duration(i) * 10 * time.Second).UnixNano()
		for tr := range trucks {
			fmt.Fprintf(&b, "readings,name=truck_%d,fleet=South,driver=Trish,model=H-2 load_capacity=1500,latitude=%d.31854,velocity=%di %d\n", tr, 50+i%9, i%70, ns)
			fmt.Fprintf(&b, "diagnostics,name=truck_%d,fleet=South,driver=Trish,model=H-2 fuel_state=0.%d,status=%di %d\n", tr, 1+i%9, i%5, ns)
		}
	}
	for _, l := range extra {
		b.WriteString(l + "\n")
	}
	path := filepath.Join(t.TempDir(), "tsbs.txt")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	return path
}

// TestTSBSMessagesDecodeToTheMergedReadings checks that the service's
// own decoder reads each published message as exactly the merged
// readings of the store measurement, moved by whole days: floats stay
// floats, strings are escaped, a late line counts once.
func TestTSBSMessagesDecodeToTheMergedReadings(t *testing.T) {
	ns := tsbsT0.Add(10 * time.Second).UnixNano()
	file := writeTSBSFile(t, 2, 150,
		fmt.Sprintf(`diagnostics,name=truck_0,fleet=South status=9i,note="a \"quoted\" \\ note" %d`, ns), // late: truck_0 at 10 s again
		fmt.Sprintf(`readings,fleet=North velocity=3i %d`, ns))                                           // no name tag: skipped
	now := tsbsT0.Add(3*24*time.Hour + 30*time.Minute)
	msgs, err := loadTSBSMessages(file, now, nil)
	require.NoError(t, err)
	shift := buckets.Ticks(3 * 24 * time.Hour / 100)
	assert.Equal(t, 3*24*time.Hour, msgs.shift)
	assert.Equal(t, tsbsT0.Add(3*24*time.Hour), msgs.first)
	assert.Equal(t, tsbsT0.Add(3*24*time.Hour+149*10*time.Second), msgs.last)

	var want [][]buckets.Reading
	values := 0
	require.NoError(t, eachTSBSMessage(file, func(msg []buckets.Reading, n int) error {
		for i := range msg {
			msg[i].Ticks += shift
		}
		want = append(want, msg)
		values += n
		return nil
	}))
	require.Equal(t, len(want), msgs.count())
	assert.Equal(t, 2*150+1, msgs.readingsBefore(msgs.count()), "the late line is a reading of its own")
	assert.Equal(t, 2*150, msgs.readings, "the late line's reading merges into one stored before")
	assert.Equal(t, values, msgs.values)
	sawLate := false
	for m := range msgs.count() {
		nm := msgs.natsMsg(m)
		dev, ok := strings.CutPrefix(nm.Subject, "telemetry.")
		require.True(t, ok, nm.Subject)
		got, _, err := ingest.Decode(buckets.DeviceID(dev), nm.Data, 0)
		require.NoError(t, err, "message %d: %s", m, nm.Data)
		assert.Equal(t, want[m], got, "message %d", m)
		assert.Equal(t, len(got), msgs.readingsBefore(m+1)-msgs.readingsBefore(m))
		for _, r := range got {
			if v, ok := r.Get("readings.load_capacity"); ok {
				assert.Equal(t, buckets.Float(1500), v, "a float without a fraction stays a float")
			}
			if v, ok := r.Get("diagnostics.note"); ok {
				assert.Equal(t, buckets.String(`a "quoted" \ note`), v)
				sawLate = true
			}
		}
	}
	assert.True(t, sawLate, "the late line was published")
}

func TestTSBSShiftKeepsTimesOfDay(t *testing.T) {
	newest := time.Date(2026, 11, 22, 5, 59, 50, 0, time.UTC)
	for _, c := range []struct {
		now  time.Time
		want time.Duration
	}{
		{time.Date(2026, 11, 23, 3, 35, 0, 0, time.UTC), 0},                 // yesterday's file: sent as it is
		{newest.Add(time.Minute), 0},                                        // just old enough
		{newest.Add(time.Minute - time.Nanosecond), -24 * time.Hour},        // not yet: a day back
		{time.Date(2026, 11, 22, 5, 0, 0, 0, time.UTC), -24 * time.Hour},    // in the future
		{time.Date(2026, 11, 25, 7, 0, 0, 0, time.UTC), 3 * 24 * time.Hour}, // three days later: to today
		{time.Date(2026, 11, 25, 5, 0, 0, 0, time.UTC), 2 * 24 * time.Hour}, // before its time of day: to yesterday
	} {
		got := tsbsShift(newest, c.now)
		assert.Equal(t, c.want, got, "now %s", c.now)
		moved := newest.Add(got)
		assert.False(t, moved.After(c.now.Add(-time.Minute)), "now %s: newest moved to %s", c.now, moved)
		assert.Less(t, c.now.Sub(moved), 25*time.Hour, "now %s: newest moved to %s", c.now, moved)
	}
}

func TestTSBSLoadRejectsBadFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
		return p
	}
	now := tsbsT0.Add(24 * time.Hour)
	_, err := loadTSBSMessages(write("nots.txt", "readings,name=truck_0 velocity=1i\n"), now, nil)
	assert.ErrorContains(t, err, "line 1: want a time in nanoseconds")
	_, err = loadTSBSMessages(write("empty.txt", "# nothing\n"), now, nil)
	assert.ErrorContains(t, err, "holds no line")
	long := fmt.Sprintf("readings,name=truck_0 velocity=1i %d\nreadings,name=truck_0 velocity=2i %d\n",
		tsbsT0.Add(-40*24*time.Hour).UnixNano(), tsbsT0.UnixNano())
	_, err = loadTSBSMessages(write("long.txt", long), now, nil)
	assert.ErrorContains(t, err, "more than the")
	bad := fmt.Sprintf("readings,name=truck/0 velocity=1i %d\n", tsbsT0.UnixNano())
	_, err = loadTSBSMessages(write("bad.txt", bad), now, nil)
	assert.ErrorContains(t, err, "truck/0")
	_, err = parseFlags([]string{"-phases", "tsbs"}, &bytes.Buffer{})
	assert.ErrorContains(t, err, "-tsbs FILE")
}

// TestTSBSPhase runs the tsbs phase on a small file against two copies
// of the service binary, alternately, and checks every run stored the
// distinct readings.
func TestTSBSPhase(t *testing.T) {
	if testing.Short() {
		t.Skip("starts telemetryd twice")
	}
	ctx := testContext(t)
	late := fmt.Sprintf("diagnostics,name=truck_1 status=9i %d", tsbsT0.Add(20*time.Second).UnixNano())
	file := writeTSBSFile(t, 3, 250, late)
	bin := serviceBinary(t)
	cfg := DefaultConfig()
	cfg.Phases, cfg.TSBSFile, cfg.Binary, cfg.Compare = []string{"tsbs"}, file, bin, bin
	cfg.Repeat, cfg.WorkDir, cfg.Progress = 1, t.TempDir(), 0
	res, err := Run(ctx, cfg, &bytes.Buffer{})
	require.NoError(t, err)
	require.Len(t, res.TSBS, 2)
	assert.Equal(t, []string{"A", "B"}, []string{res.TSBS[0].Label, res.TSBS[1].Label})
	for _, r := range res.TSBS {
		assert.Equal(t, 750, r.Readings)
		assert.Equal(t, 750*5+1, r.Values, "5 fields per truck and time, and the late line's")
		assert.Positive(t, r.Rate)
		assert.Positive(t, r.ServiceCPU)
		assert.Positive(t, r.PeakRSS)
		assert.Positive(t, r.DiskBytes)
	}
	text := buildReport(res).text()
	assert.Contains(t, text, "B/A, publish to stored: ")
	assert.Contains(t, text, "750 readings")
	assert.NotContains(t, text, "Ingest throughput", "parts that did not run are left out")
}
