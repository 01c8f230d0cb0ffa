package retention_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/bucketstest"
	"github.com/telemetryd/telemetryd/retention"
)

// fakeStore is a Dropper over an in-memory list of tables.
type fakeStore struct {
	mu       sync.Mutex
	tables   map[buckets.Day]buckets.TableInfo
	dropErr  map[buckets.Day]error // DropTable fails for these days
	listErr  error                 // Tables fails while set
	drops    []buckets.Day         // DropTable calls, in order
	lists    int                   // Tables calls
	listed   chan struct{}         // one send per Tables call, when not nil
	inRun    int                   // calls in progress
	maxInRun int                   // most calls ever in progress at once
	delay    time.Duration         // DropTable sleeps this long
}

func newFakeStore(tables ...buckets.TableInfo) *fakeStore {
	f := &fakeStore{tables: map[buckets.Day]buckets.TableInfo{}, dropErr: map[buckets.Day]error{}}
	for _, t := range tables {
		f.tables[t.Day] = t
	}
	return f
}

func (f *fakeStore) Tables(ctx context.Context) ([]buckets.TableInfo, error) {
	f.mu.Lock()
	f.lists++
	err := f.listErr
	out := make([]buckets.TableInfo, 0, len(f.tables))
	for _, t := range f.tables {
		out = append(out, t)
	}
	f.mu.Unlock()
	if f.listed != nil {
		select {
		case f.listed <- struct{}{}:
		case <-ctx.Done():
		}
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (f *fakeStore) DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error) {
	f.mu.Lock()
	f.inRun++
	f.maxInRun = max(f.maxInRun, f.inRun)
	f.drops = append(f.drops, day)
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.inRun--; f.mu.Unlock() }()
	time.Sleep(f.delay)

	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.dropErr[day]; err != nil {
		return buckets.TableDrop{}, err
	}
	t, ok := f.tables[day]
	if !ok {
		return buckets.TableDrop{}, fmt.Errorf("drop table %s: %w", day, buckets.ErrNotFound)
	}
	delete(f.tables, day)
	// The store measures the table as it drops it: a little bigger
	// than when it was listed.
	return buckets.TableDrop{Day: day, SizeBytes: t.SizeBytes + 1, Readings: t.Readings}, nil
}

func (f *fakeStore) remaining() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for d := range f.tables {
		out = append(out, d.String())
	}
	slices.Sort(out)
	return out
}

func (f *fakeStore) dropCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []string{}
	for _, d := range f.drops {
		out = append(out, d.String())
	}
	return out
}

// harness captures what a worker tells the outside world.
type harness struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	logs   *bucketstest.SyncBuffer
}

// logRecords returns the JSON log records whose msg is msg.
func logRecords(t *testing.T, logs *bucketstest.SyncBuffer, msg string) []map[string]any {
	t.Helper()
	recs, err := logs.Records(msg)
	require.NoError(t, err)
	return recs
}

// newTestWorker builds a worker over f with the test clock, a fixed
// jitter draw (the middle: no jitter) and recording telemetry.
func newTestWorker(t *testing.T, f retention.Dropper, cfg retention.Config) (*retention.Worker, *harness) {
	t.Helper()
	h := &harness{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder(), logs: &bucketstest.SyncBuffer{}}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(h.spans))
	t.Cleanup(func() {
		assert.NoError(t, mp.Shutdown(context.Background()))
		assert.NoError(t, tp.Shutdown(context.Background()))
	})
	cfg.MeterProvider, cfg.TracerProvider = mp, tp
	cfg.Logger = slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return now }
	}
	if cfg.Rand == nil {
		cfg.Rand = func() float64 { return 0.5 }
	}
	w, err := retention.NewWorker(f, cfg)
	require.NoError(t, err)
	return w, h
}

// sum adds the data points of the counter name whose attributes
// include attrs.
func (h *harness) sum(t *testing.T, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	var total int64
	for _, m := range h.collect(t, name) {
		data, ok := m.Data.(metricdata.Sum[int64])
		require.True(t, ok, "%s is a %T", name, m.Data)
		for _, dp := range data.DataPoints {
			if hasAttrs(dp.Attributes, attrs) {
				total += dp.Value
			}
		}
	}
	return total
}

// histogramCount counts the recordings of the histogram name.
func (h *harness) histogramCount(t *testing.T, name string, attrs ...attribute.KeyValue) uint64 {
	t.Helper()
	var n uint64
	for _, m := range h.collect(t, name) {
		data, ok := m.Data.(metricdata.Histogram[float64])
		require.True(t, ok, "%s is a %T", name, m.Data)
		assert.Equal(t, "s", m.Unit)
		for _, dp := range data.DataPoints {
			if hasAttrs(dp.Attributes, attrs) {
				n += dp.Count
			}
		}
	}
	return n
}

func (h *harness) collect(t *testing.T, name string) []metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, h.reader.Collect(context.Background(), &rm))
	var out []metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				out = append(out, m)
			}
		}
	}
	return out
}

func hasAttrs(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// runSpan returns the single ended retention.run span.
func (h *harness) runSpan(t *testing.T) sdktrace.ReadOnlySpan {
	t.Helper()
	ended := h.spans.Ended()
	require.Len(t, ended, 1)
	require.Equal(t, "retention.run", ended[0].Name())
	return ended[0]
}

func spanAttr(attrs []attribute.KeyValue, key string) attribute.Value {
	for _, kv := range attrs {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// events renders span events as "name day size_bytes reason".
func events(s sdktrace.ReadOnlySpan) []string {
	out := []string{}
	for _, e := range s.Events() {
		out = append(out, fmt.Sprintf("%s %s %d %s", e.Name, spanAttr(e.Attributes, "day").AsString(),
			spanAttr(e.Attributes, "size_bytes").AsInt64(), spanAttr(e.Attributes, "reason").AsString()))
	}
	return out
}

// fixture: a 3-day retention at 2026-11-22 with a 400-byte cap. The
// 18th and 17th expired; the 19th goes to the size cap.
func fixture(t *testing.T) (*fakeStore, retention.Config) {
	f := newFakeStore(
		table(t, "2026-11-17", 100), table(t, "2026-11-18", 200), table(t, "2026-11-19", 300),
		table(t, "2026-11-20", 150), table(t, "2026-11-21", 150), table(t, "2026-11-22", 50),
	)
	return f, retention.Config{Policy: retention.Policy{Retention: 72 * time.Hour, MaxBytes: 400}}
}

func TestRunOnceDryRun(t *testing.T) {
	f, cfg := fixture(t)
	w, h := newTestWorker(t, f, cfg)

	rep, err := w.RunOnce(context.Background(), true)
	require.NoError(t, err)

	assert.Empty(t, f.dropCalls(), "a dry run drops nothing")
	assert.Len(t, f.remaining(), 6)
	assert.True(t, rep.DryRun)
	assert.Equal(t, now, rep.Started)
	assert.Equal(t, now.Add(-72*time.Hour), rep.Cutoff)
	assert.Equal(t, []buckets.TableDrop{
		{Day: day(t, "2026-11-17"), SizeBytes: 100, Readings: 10, Reason: "expired"},
		{Day: day(t, "2026-11-18"), SizeBytes: 200, Readings: 20, Reason: "expired"},
		{Day: day(t, "2026-11-19"), SizeBytes: 300, Readings: 30, Reason: "size_limit"},
	}, rep.Dropped)
	assert.Equal(t, 3, rep.Kept, "what the run would keep")
	assert.Equal(t, int64(350), rep.BytesNow, "what the run would leave")

	s := h.runSpan(t)
	assert.Equal(t, true, spanAttr(s.Attributes(), "dry_run").AsBool())
	assert.Equal(t, []string{
		"table.would_drop 2026-11-17 100 expired",
		"table.would_drop 2026-11-18 200 expired",
		"table.would_drop 2026-11-19 300 size_limit",
	}, events(s))

	assert.Zero(t, h.sum(t, "telemetry.retention.tables_dropped"), "nothing was dropped")
	assert.Zero(t, h.sum(t, "telemetry.retention.bytes_freed"))
	assert.Equal(t, int64(1), h.sum(t, "telemetry.retention.runs", attribute.String("outcome", "ok"), attribute.Bool("dry_run", true)))
	assert.Len(t, logRecords(t, h.logs, "retention would drop table"), 3)
	assert.Empty(t, logRecords(t, h.logs, "retention dropped table"))
}

func TestRunOnceDrops(t *testing.T) {
	f, cfg := fixture(t)
	w, h := newTestWorker(t, f, cfg)

	rep, err := w.RunOnce(context.Background(), false)
	require.NoError(t, err)

	assert.Equal(t, []string{"2026-11-17", "2026-11-18", "2026-11-19"}, f.dropCalls(), "exactly the chosen tables, oldest first")
	assert.Equal(t, []string{"2026-11-20", "2026-11-21", "2026-11-22"}, f.remaining())
	assert.False(t, rep.DryRun)
	assert.Equal(t, []buckets.TableDrop{
		{Day: day(t, "2026-11-17"), SizeBytes: 101, Readings: 10, Reason: "expired"},
		{Day: day(t, "2026-11-18"), SizeBytes: 201, Readings: 20, Reason: "expired"},
		{Day: day(t, "2026-11-19"), SizeBytes: 301, Readings: 30, Reason: "size_limit"},
	}, rep.Dropped, "sizes as the store measured them at the drop")
	assert.Equal(t, 3, rep.Kept)
	assert.Equal(t, int64(350), rep.BytesNow)

	s := h.runSpan(t)
	assert.Equal(t, false, spanAttr(s.Attributes(), "dry_run").AsBool())
	assert.Equal(t, codes.Unset, s.Status().Code)
	assert.Equal(t, []string{
		"table.dropped 2026-11-17 101 expired",
		"table.dropped 2026-11-18 201 expired",
		"table.dropped 2026-11-19 301 size_limit",
	}, events(s))

	assert.Equal(t, int64(2), h.sum(t, "telemetry.retention.tables_dropped", attribute.String("reason", "expired")))
	assert.Equal(t, int64(1), h.sum(t, "telemetry.retention.tables_dropped", attribute.String("reason", "size_limit")))
	assert.Equal(t, int64(603), h.sum(t, "telemetry.retention.bytes_freed"))
	bytesFreed := h.collect(t, "telemetry.retention.bytes_freed")
	require.Len(t, bytesFreed, 1)
	assert.Equal(t, "By", bytesFreed[0].Unit)
	assert.Equal(t, int64(1), h.sum(t, "telemetry.retention.runs", attribute.String("outcome", "ok"), attribute.Bool("dry_run", false)))
	assert.Equal(t, uint64(1), h.histogramCount(t, "telemetry.retention.run.duration"))

	logs := logRecords(t, h.logs, "retention dropped table")
	require.Len(t, logs, 3, "one line per dropped table")
	assert.Equal(t, "2026-11-19", logs[2]["day"])
	assert.Equal(t, float64(301), logs[2]["size_bytes"])
	assert.Equal(t, float64(30), logs[2]["readings"])
	assert.Equal(t, "size_limit", logs[2]["reason"])

	// Nothing is left to drop on the next run.
	rep, err = w.RunOnce(context.Background(), false)
	require.NoError(t, err)
	assert.Empty(t, rep.Dropped)
	assert.Equal(t, 3, rep.Kept)
}

func TestRunOnceDropFailureDoesNotStopTheRest(t *testing.T) {
	f, cfg := fixture(t)
	diskErr := errors.New("remove /data/2026-11-18: read-only file system")
	f.dropErr[day(t, "2026-11-18")] = diskErr
	w, h := newTestWorker(t, f, cfg)

	rep, err := w.RunOnce(context.Background(), false)
	require.Error(t, err)
	assert.ErrorIs(t, err, diskErr)
	assert.Contains(t, err.Error(), "drop table 2026-11-18 (expired)")

	assert.Equal(t, []string{"2026-11-17", "2026-11-18", "2026-11-19"}, f.dropCalls(), "the failure did not stop the next drop")
	assert.Equal(t, []string{"2026-11-18", "2026-11-20", "2026-11-21", "2026-11-22"}, f.remaining())
	assert.Equal(t, []string{"2026-11-17 expired", "2026-11-19 size_limit"}, dropped(rep.Dropped), "the report holds what was dropped")
	assert.Equal(t, 4, rep.Kept, "the failed table is still there")
	assert.Equal(t, int64(550), rep.BytesNow)

	s := h.runSpan(t)
	assert.Equal(t, codes.Error, s.Status().Code)
	assert.Contains(t, events(s), "table.drop_failed 2026-11-18 200 expired")
	assert.Equal(t, int64(1), h.sum(t, "telemetry.retention.runs", attribute.String("outcome", "error")))
	assert.Zero(t, h.sum(t, "telemetry.retention.runs", attribute.String("outcome", "ok")))
	assert.Equal(t, int64(2), h.sum(t, "telemetry.retention.tables_dropped"))
}

func TestRunOnceTableAlreadyGone(t *testing.T) {
	f, cfg := fixture(t)
	f.dropErr[day(t, "2026-11-17")] = fmt.Errorf("drop table 2026-11-17: %w", buckets.ErrNotFound)
	w, h := newTestWorker(t, f, cfg)

	rep, err := w.RunOnce(context.Background(), false)
	require.NoError(t, err, "a table someone else dropped meanwhile is not a failure")
	assert.Equal(t, []string{"2026-11-18 expired", "2026-11-19 size_limit"}, dropped(rep.Dropped))
	assert.Equal(t, 3, rep.Kept)
	assert.Equal(t, int64(1), h.sum(t, "telemetry.retention.runs", attribute.String("outcome", "ok")))
}

func TestRunOnceListFailure(t *testing.T) {
	f, cfg := fixture(t)
	f.listErr = errors.New("store closed")
	w, h := newTestWorker(t, f, cfg)

	rep, err := w.RunOnce(context.Background(), false)
	require.ErrorIs(t, err, f.listErr)
	assert.Contains(t, err.Error(), "list tables")
	assert.Empty(t, rep.Dropped)
	assert.Empty(t, f.dropCalls())
	assert.Equal(t, int64(1), h.sum(t, "telemetry.retention.runs", attribute.String("outcome", "error")))
	assert.Equal(t, codes.Error, h.runSpan(t).Status().Code)
}

func TestRunOnceIsSerialised(t *testing.T) {
	var tables []buckets.TableInfo
	for d := range 8 {
		tables = append(tables, buckets.TableInfo{Day: buckets.DayOfTime(now) - 100 + buckets.Day(d), SizeBytes: 1})
	}
	f := newFakeStore(tables...)
	f.delay = 2 * time.Millisecond
	w, _ := newTestWorker(t, f, retention.Config{Policy: retention.Policy{Retention: time.Hour}})

	var wg sync.WaitGroup
	reports := make([]buckets.RetentionReport, 4)
	for i := range reports {
		wg.Go(func() {
			rep, err := w.RunOnce(context.Background(), false)
			assert.NoError(t, err)
			reports[i] = rep
		})
	}
	wg.Wait()
	assert.Equal(t, 1, f.maxInRun, "two runs never drop at the same time")
	total := 0
	for _, r := range reports {
		total += len(r.Dropped)
	}
	assert.Equal(t, 8, total, "each table is dropped by exactly one run")
	assert.Len(t, f.dropCalls(), 8)
}

func TestRunOnceWaitingHonoursContext(t *testing.T) {
	f, cfg := fixture(t)
	f.listed = make(chan struct{}) // the first run blocks in Tables until read
	w, _ := newTestWorker(t, f, cfg)

	first := make(chan error, 1)
	go func() {
		_, err := w.RunOnce(context.Background(), true)
		first <- err
	}()
	// Wait until the first run holds the worker, then try a second one.
	require.Eventually(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.lists == 1 }, 5*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := w.RunOnce(ctx, true)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	<-f.listed
	require.NoError(t, <-first)
}

func TestRunRunsAtStartThenOnInterval(t *testing.T) {
	f, cfg := fixture(t)
	f.listed = make(chan struct{}, 100)
	cfg.Interval = 20 * time.Millisecond
	w, _ := newTestWorker(t, f, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.Run(ctx) }()

	for i := range 4 {
		select {
		case <-f.listed:
		case <-time.After(5 * time.Second):
			t.Fatalf("run %d did not happen", i+1)
		}
	}
	elapsed := time.Since(start)
	assert.GreaterOrEqual(t, elapsed, 3*cfg.Interval, "runs 2..4 each waited an interval")
	assert.Equal(t, []string{"2026-11-20", "2026-11-21", "2026-11-22"}, f.remaining(), "the runs dropped what expired")

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestRunStartsImmediatelyAndStopsPromptly(t *testing.T) {
	f, cfg := fixture(t)
	f.listed = make(chan struct{}, 10)
	cfg.Interval = time.Hour
	w, _ := newTestWorker(t, f, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	select {
	case <-f.listed:
	case <-time.After(5 * time.Second):
		t.Fatal("no run at start")
	}
	require.Eventually(t, func() bool { return len(f.remaining()) == 3 }, 5*time.Second, time.Millisecond)

	cancelled := time.Now()
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
		assert.Less(t, time.Since(cancelled), time.Second, "Run stops without waiting out the interval")
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	assert.Len(t, f.listed, 0, "no second run within the hour")
}

func TestRunLogsFailureAndKeepsGoing(t *testing.T) {
	f, cfg := fixture(t)
	f.listed = make(chan struct{}, 100)
	f.listErr = errors.New("disk unavailable")
	cfg.Interval = 10 * time.Millisecond
	w, h := newTestWorker(t, f, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-f.listed
	<-f.listed // a second run after the failed first one
	f.mu.Lock()
	f.listErr = nil
	f.mu.Unlock()
	require.Eventually(t, func() bool { return len(f.remaining()) == 3 }, 5*time.Second, time.Millisecond,
		"a later run succeeds")
	cancel()
	require.NoError(t, <-done)

	failures := logRecords(t, h.logs, "retention run failed")
	require.NotEmpty(t, failures)
	for _, l := range failures {
		assert.Contains(t, l["err"], "disk unavailable")
	}
	assert.Equal(t, int64(len(failures)), h.sum(t, "telemetry.retention.runs", attribute.String("outcome", "error")),
		"each failed run is logged once")
}

func TestNewWorkerRejectsBadConfig(t *testing.T) {
	f := newFakeStore()
	ok := retention.Policy{Retention: time.Hour}
	tests := []struct {
		name string
		d    retention.Dropper
		cfg  retention.Config
		msg  string
	}{
		{"nil dropper", nil, retention.Config{Policy: ok}, "nil Dropper"},
		{"zero retention", f, retention.Config{}, "Retention 0s must be positive"},
		{"negative retention", f, retention.Config{Policy: retention.Policy{Retention: -time.Hour}}, "must be positive"},
		{"negative max bytes", f, retention.Config{Policy: retention.Policy{Retention: time.Hour, MaxBytes: -1}}, "MaxBytes -1 must not be negative"},
		{"negative interval", f, retention.Config{Policy: ok, Interval: -time.Second}, "Interval -1s must not be negative"},
		{"jitter of 1", f, retention.Config{Policy: ok, Jitter: 1}, "Jitter 1 must be in [0, 1)"},
		{"negative jitter", f, retention.Config{Policy: ok, Jitter: -0.1}, "Jitter -0.1 must be in [0, 1)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := retention.NewWorker(tc.d, tc.cfg)
			require.Error(t, err)
			assert.Nil(t, w)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}

	w, err := retention.NewWorker(f, retention.Config{Policy: ok, Jitter: 0.99})
	require.NoError(t, err)
	require.NotNil(t, w)
}

func TestRunOnceStopsWhenCancelled(t *testing.T) {
	f, cfg := fixture(t)
	f.delay = 30 * time.Millisecond
	w, _ := newTestWorker(t, f, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for len(f.dropCalls()) == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()

	rep, err := w.RunOnce(ctx, false)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "retention run stopped before dropping 2026-11-18")
	assert.Equal(t, []string{"2026-11-17"}, f.dropCalls(), "no drop starts after the cancel")
	assert.Equal(t, []string{"2026-11-17 expired"}, dropped(rep.Dropped))
	assert.Equal(t, 5, rep.Kept)
}
