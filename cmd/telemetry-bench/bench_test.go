package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest"
)

// TestTinyRun runs every part of the benchmark at a tiny size, so that
// the command keeps working as the service changes.
func TestTinyRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds telemetryd and starts it eight times")
	}
	ctx := testContext(t)
	out := filepath.Join(t.TempDir(), "report.md")
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-readings", "3000", "-devices", "10", "-query-readings", "40000", "-queries", "20", "-repeat", "2", "-paced-rates", "",
		"-work-dir", t.TempDir(), "-progress", "0", "-out", out}, &stdout, &stderr)
	require.Equal(t, 0, code, "stderr:\n%s", stderr.String())

	text := stdout.String()
	for _, want := range []string{"raw Badger: one WriteBatch", "raw Badger: WriteBatch per 5000 readings, 2 writers", "raw JetStream 1/msg: consume+ack", "store.Write",
		"1/msg telemetry off", "100/msg sync-writes", "10000/msg", "latest-10", "1-hour range (3,600 readings)",
		"after Badger Flatten", "Targets"} {
		assert.Contains(t, text, want)
	}
	assert.NotContains(t, text, " 0 MiB", "every service run reports its peak RSS")
	assert.Contains(t, text, "(2 runs: ", "repeated runs show their range")
	md, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Contains(t, string(md), "| end to end 100/msg |")
	assert.Contains(t, stderr.String(), "end to end 1/msg (stored): done", "progress lines")
}

// TestRunMeasuresEveryPart checks the figures behind the report.
func TestRunMeasuresEveryPart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts telemetryd")
	}
	ctx := testContext(t)
	cfg := DefaultConfig()
	cfg.Readings, cfg.Devices, cfg.QueryReadings, cfg.Queries = 2000, 10, 40000, 10
	cfg.Phases, cfg.WorkDir, cfg.Progress, cfg.PacedRates = []string{"raw", "store", "query"}, t.TempDir(), 0, []int{5000}
	cfg.Binary = serviceBinary(t)
	res, err := Run(ctx, cfg, &bytes.Buffer{})
	require.NoError(t, err)
	require.Len(t, res.RawBadgerVariants, 2)
	for _, v := range res.RawBadgerVariants {
		assert.Positive(t, v.Rate, v.Name)
		assert.LessOrEqual(t, v.Rate, res.RawBadger, "the ceiling is the best variant")
	}
	assert.Positive(t, res.StoreWrite)
	require.Len(t, res.RawJS, 2)
	for _, j := range res.RawJS {
		assert.Positive(t, j.publish)
		assert.Positive(t, j.consume)
		assert.Positive(t, j.pipeline)
	}
	q := res.Query
	require.NotNil(t, q)
	assert.Equal(t, 40000, q.Readings)
	assert.Equal(t, 3600, q.RangeReadings)
	require.Len(t, q.Loaded, 2, "full speed, then paced")
	assert.Zero(t, q.Loaded[0].Target)
	assert.Equal(t, 5000, q.Loaded[1].Target)
	assert.InDelta(t, 5000, q.Loaded[1].Rate, 2500, "the paced ingest keeps its rate")
	for _, l := range []latency{q.RawLatest, q.RawRange, q.IdleLatest, q.IdleRange, q.Loaded[0].Latest, q.Loaded[0].Range, q.Loaded[1].Latest} {
		assert.Equal(t, 10, l.N)
		assert.Positive(t, l.P50)
		assert.GreaterOrEqual(t, l.P99, l.P50)
	}
	assert.Positive(t, q.Loaded[0].Rate, "readings were ingested during the loaded queries")
	assert.Positive(t, q.DiskCompacted)
	assert.Positive(t, q.PeakRSS)
}

// TestPayloadIsWhatTheStoreWrites checks that the service decodes each
// published payload into exactly the readings the raw and store
// measurements write.
func TestPayloadIsWhatTheStoreWrites(t *testing.T) {
	devs := deviceIDs(7)
	for _, perMsg := range []int{1, 100} {
		w := newWorkload(devs, 3000, perMsg, time.Second, time.Date(2026, 11, 22, 0, 10, 0, 0, time.UTC))
		for _, m := range []int{0, 1, 6, 7, w.msgs - 1} {
			got, _, err := ingest.Decode(w.device(m), w.payload(nil, m), 0)
			require.NoError(t, err)
			assert.Equal(t, w.appendReadings(nil, m), got, "message %d of %d/msg", m, perMsg)
		}
	}
}

func TestWorkloadStaysInOneDay(t *testing.T) {
	devs := deviceIDs(1000)
	for _, end := range []time.Time{
		time.Date(2026, 11, 22, 0, 5, 0, 0, time.UTC), // just after midnight
		time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC),
	} {
		w := newWorkload(devs, 2_000_000, 100, time.Second, end)
		first, last := w.at(0, 0), w.at(w.msgs-1, w.perMsg-1)
		assert.Equal(t, buckets.DayOfTime(first), buckets.DayOfTime(last), "end %s", end)
		assert.False(t, last.After(end), "end %s: last reading %s", end, last)
		assert.Equal(t, 2_000_000, w.readings())
		assert.Equal(t, time.Second, w.step)
	}
	w := newWorkload(devs, 100_000_000, 1, time.Second, time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC))
	assert.Less(t, w.step, time.Second, "a day cannot hold 100,000 readings per device at one per second")
	assert.Equal(t, buckets.DayOfTime(w.at(0, 0)), buckets.DayOfTime(w.at(w.msgs-1, 0)))
}

func TestQuickFlagKeepsExplicitSizes(t *testing.T) {
	cfg, err := parseFlags([]string{"-quick", "-readings", "5000"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, 5000, cfg.Readings)
	assert.Equal(t, QuickConfig().QueryReadings, cfg.QueryReadings)
	assert.Equal(t, QuickConfig().Queries, cfg.Queries)

	assert.Empty(t, cfg.PacedRates, "-quick measures under full-speed ingest only")

	cfg, err = parseFlags(nil, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, []int{100_000, 200_000}, cfg.PacedRates)
	cfg, err = parseFlags([]string{"-quick", "-paced-rates", "5,7"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, []int{5, 7}, cfg.PacedRates)
	_, err = parseFlags([]string{"-paced-rates", "5,x"}, &bytes.Buffer{})
	require.ErrorContains(t, err, `"x" is not a positive number`)

	_, err = parseFlags([]string{"-phases", "raw,bogus"}, &bytes.Buffer{})
	require.ErrorContains(t, err, `unknown part "bogus"`)
	_, err = parseFlags([]string{"-devices", "10", "-readings", "9"}, &bytes.Buffer{})
	require.ErrorContains(t, err, "at least one per device")
	cfg, err = parseFlags([]string{"-doors", "mqtt"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, []string{"mqtt"}, cfg.Doors)
	_, err = parseFlags([]string{"-doors", "mqtt,coap"}, &bytes.Buffer{})
	require.ErrorContains(t, err, `unknown door "coap"`)
}

func TestSummarize(t *testing.T) {
	ds := make([]time.Duration, 0, 200)
	for i := 200; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	l := summarize(ds)
	assert.Equal(t, 200, l.N)
	assert.Equal(t, 101*time.Millisecond, l.P50)
	assert.Equal(t, 199*time.Millisecond, l.P99)
	assert.Equal(t, 200*time.Millisecond, l.Max)
	assert.True(t, strings.HasSuffix(ms(l.P99), " ms"))
}

func TestScheduleRepeatsOnlyComparedRuns(t *testing.T) {
	var names []string
	for _, r := range e2eSchedule(e2eRuns(), 2) {
		names = append(names, r.Name)
	}
	assert.Equal(t, []string{
		"1/msg", "1/msg sync-writes", "1/msg telemetry off", "1/msg one stream", "100/msg", "100/msg sync-writes", "100/msg telemetry off", "100/msg one stream",
		"100/msg memory-limit 512MiB", "100/msg memory-limit 4GiB",
		"1/msg", "1/msg sync-writes", "1/msg telemetry off", "1/msg one stream", "100/msg", "100/msg sync-writes", "100/msg telemetry off", "100/msg one stream",
		"100/msg memory-limit 512MiB", "100/msg memory-limit 4GiB",
		"10000/msg",
	}, names)
}

func TestReportUsesMedianRun(t *testing.T) {
	res := &Results{E2E: []e2eResult{
		{Run: e2eRun{Name: "1/msg"}, Rate: 30}, {Run: e2eRun{Name: "1/msg"}, Rate: 10},
		{Run: e2eRun{Name: "1/msg"}, Rate: 20}, {Run: e2eRun{Name: "100/msg"}, Rate: 5},
	}}
	assert.Equal(t, 20.0, res.e2eRate("1/msg"))
	assert.Equal(t, " (3 runs: 10-30)", res.e2eSpread("1/msg"))
	assert.Equal(t, 5.0, res.e2eRate("100/msg"))
	assert.Equal(t, "", res.e2eSpread("100/msg"))
	assert.Zero(t, res.e2eRate("10000/msg"))
}

func TestFsyncFlagsAndMeasure(t *testing.T) {
	cfg, err := parseFlags([]string{"-fsync-files", "1,4", "-fsync-seconds", "200ms"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, []int{1, 4}, cfg.FsyncFiles)
	_, err = parseFlags([]string{"-fsync-files", "2000"}, &bytes.Buffer{})
	require.ErrorContains(t, err, "want counts of 1 to 1024")

	r, err := measureFsync(context.Background(), t.TempDir(), 4, 200*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, 4, r.Files)
	assert.Positive(t, r.Fsyncs, "every writer fsyncs at least once")

	var out bytes.Buffer
	cfg.WorkDir, cfg.Progress = t.TempDir(), 0
	require.NoError(t, runFsync(context.Background(), cfg, &out, io.Discard))
	assert.Contains(t, out.String(), "| 4 | ")
}

// testContext bounds a run by the test binary's own deadline (go test
// -timeout) less a minute to report what hung, not by a guess of how
// fast a busy machine is.
func testContext(t *testing.T) context.Context {
	t.Helper()
	d, ok := t.Deadline()
	if !ok {
		return t.Context()
	}
	ctx, cancel := context.WithDeadline(t.Context(), d.Add(-time.Minute))
	t.Cleanup(cancel)
	return ctx
}

// built is telemetryd, built once for the tests that run the binary.
var built struct {
	once      sync.Once
	dir, path string
	err       error
}

// serviceBinary builds telemetryd with buildService, the first time
// it is called, and returns the binary. TestTinyRun builds its own, as
// the command does when -binary is not given.
func serviceBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "telemetry-bench-test")
		if built.err == nil {
			built.path, built.err = buildService(context.Background(), built.dir)
		}
	})
	require.NoError(t, built.err)
	return built.path
}

// TestMain runs the tests and removes the binary serviceBinary built.
func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}
