package promapi

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// rangeFixture is a real store with three trucks of two fleets sending
// every 10 s for two hours, an API that keeps range answers and one
// that keeps none, to compare with.
type rangeFixture struct {
	t             *testing.T
	st            *store.Store
	cached, plain *API
	t0            time.Time
}

func newRangeFixture(t *testing.T) *rangeFixture {
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	st := openStoreAt(t, t0.Add(3*time.Hour))
	f := &rangeFixture{t: t, st: st, t0: t0}
	for d, fleet := range []string{"East", "East", "West"} {
		dev := buckets.DeviceID(fmt.Sprintf("truck_%d", d+1))
		require.NoError(t, st.Assign(context.Background(), []buckets.Assignment{{Device: dev, At: buckets.MustTicks(t0),
			Set: attrs("fleet", fleet, "model", fmt.Sprintf("M-%d", d))}}))
		var rs []buckets.Reading
		for i := range 720 {
			rs = append(rs, f.reading(dev, t0.Add(time.Duration(i)*10*time.Second), float64((i*7+d*3)%11)))
		}
		f.write(rs...)
	}
	var err error
	f.cached, err = New(Config{Source: st})
	require.NoError(t, err)
	require.NotNil(t, f.cached.results, "the store tells of its changes")
	f.plain, err = New(Config{Source: st, ResultCacheBytes: -1})
	require.NoError(t, err)
	require.Nil(t, f.plain.results)
	return f
}

func (f *rangeFixture) reading(dev buckets.DeviceID, at time.Time, v float64) buckets.Reading {
	return buckets.Reading{Device: dev, Ticks: buckets.MustTicks(at), Values: []buckets.Field{{Name: "velocity", Value: buckets.Float(v)}}}
}

func (f *rangeFixture) write(rs ...buckets.Reading) {
	f.t.Helper()
	require.NoError(f.t, f.st.Write(context.Background(), rs))
}

// ask is the body of a range query of a over the window of length w
// ending at end, at step 10 s.
func (f *rangeFixture) ask(a *API, q string, end time.Time, w time.Duration) string {
	f.t.Helper()
	v := url.Values{"query": {q}, "start": {fmt.Sprint(end.Add(-w).Unix())}, "end": {fmt.Sprint(end.Unix())}, "step": {"10"}}
	rec := httptest.NewRecorder()
	a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/query_range?"+v.Encode(), nil))
	require.Equal(f.t, http.StatusOK, rec.Code, rec.Body.String())
	return rec.Body.String()
}

// same asks q of both APIs and requires the same answer, which it
// returns.
func (f *rangeFixture) same(q string, end time.Time, w time.Duration) string {
	f.t.Helper()
	got := f.ask(f.cached, q, end, w)
	require.Equal(f.t, f.ask(f.plain, q, end, w), got, "%s over %s to %s", q, w, end.Format(time.TimeOnly))
	return got
}

// rangeQueries are shaped as the fleet questions are.
var rangeQueries = []string{
	`velocity`,
	`last_over_time(velocity{fleet="East"}[1h])`,
	`avg_over_time(velocity[10m]) < 5`,
	`count_over_time((avg_over_time(velocity[10m]) > 3)[1h:10m]) > 2`,
	`avg by (fleet, model) (avg_over_time(velocity[1h]) / max_over_time(velocity[1h]))`,
	`count_over_time((avg by (fleet) (avg_over_time(velocity[10m])) < 6)[1d:10m]) / 144`,
	`max_over_time(velocity[5m]) - min_over_time(velocity[5m] offset 1m)`,
}

// TestRangeCacheSlidingWindow slides a window by 10 s per refresh: each
// answer is the one of an API that keeps none, and after the first the
// kept steps answer all but the new tail.
func TestRangeCacheSlidingWindow(t *testing.T) {
	f := newRangeFixture(t)
	for _, q := range rangeQueries {
		for i := range 6 {
			f.same(q, f.t0.Add(90*time.Minute+time.Duration(i)*10*time.Second), time.Hour)
		}
		// A window past the newest reading, and the same one again.
		f.same(q, f.t0.Add(2*time.Hour+5*time.Minute), time.Hour)
		f.same(q, f.t0.Add(2*time.Hour+5*time.Minute), time.Hour)
	}
	s := f.cached.results.c.Stats()
	assert.Equal(t, int64(len(rangeQueries)), s.Hits, "the window asked again is kept whole")
	assert.Equal(t, int64(6*len(rangeQueries)), s.Partial, "each slide evaluates its tail only")
	assert.Equal(t, int64(len(rangeQueries)), s.Misses, "only the first window is evaluated whole")
	assert.Positive(t, s.Bytes)
}

// TestRangeCacheLateWrite writes a reading into steps already kept: the
// next answer holds it.
func TestRangeCacheLateWrite(t *testing.T) {
	f := newRangeFixture(t)
	end := f.t0.Add(90 * time.Minute)
	at := f.t0.Add(61 * time.Minute) // reading 366 of truck_1: 10
	for _, q := range []string{`velocity{device="truck_1"}`, `avg by (fleet) (avg_over_time(velocity[10m]))`} {
		before := f.same(q, end, time.Hour)
		f.write(f.reading("truck_1", at, 1000)) // replaces the reading of that time
		changed := f.same(q, end, time.Hour)
		assert.NotEqual(t, before, changed, q)
		f.write(f.reading("truck_1", at, 10))
		assert.Equal(t, before, f.same(q, end, time.Hour), q)
	}
	f.write(f.reading("truck_1", at, 1000))
	assert.Contains(t, f.same(`velocity{device="truck_1"}`, end, time.Hour), fmt.Sprintf(`[%d,"1000"]`, at.Unix()))
}

// TestRangeCacheDeleteAndDrop deletes a device and drops the day table:
// the answers asked again lose their series.
func TestRangeCacheDeleteAndDrop(t *testing.T) {
	f := newRangeFixture(t)
	end := f.t0.Add(90 * time.Minute)
	q := `avg_over_time(velocity[10m])`
	assert.Contains(t, f.same(q, end, time.Hour), "truck_2")
	_, err := f.st.DeleteDevice(context.Background(), "truck_2")
	require.NoError(t, err)
	assert.NotContains(t, f.same(q, end, time.Hour), "truck_2")
	assert.Contains(t, f.same(q, end, time.Hour), "truck_1")
	_, err = f.st.DropTable(context.Background(), buckets.DayOf(buckets.MustTicks(f.t0)))
	require.NoError(t, err)
	assert.NotContains(t, f.same(q, end, time.Hour), "truck_1")
}

// TestRangeCacheAttributeChange moves a truck to another fleet: the
// grouped answer asked again follows it.
func TestRangeCacheAttributeChange(t *testing.T) {
	f := newRangeFixture(t)
	end := f.t0.Add(90 * time.Minute)
	q := `count by (fleet) (avg_over_time(velocity[10m]))`
	before := f.same(q, end, time.Hour)
	require.NoError(t, f.st.Assign(context.Background(), []buckets.Assignment{{Device: "truck_2",
		At: buckets.MustTicks(f.t0.Add(time.Hour)), Set: attrs("fleet", "West", "model", "M-1")}}))
	after := f.same(q, end, time.Hour)
	assert.NotEqual(t, before, after)
	assert.NotContains(t, after, `"fleet":"East"},"values":[[1795341600,"2"]`)
}

// TestRangeCacheKeepsOut asks queries whose steps do not stand alone,
// or that a token limited to some devices asks: none is kept.
func TestRangeCacheKeepsOut(t *testing.T) {
	f := newRangeFixture(t)
	end := f.t0.Add(90 * time.Minute)
	for _, q := range []string{
		`velocity @ end()`, `velocity offset -1m`, `max_over_time(velocity[10m:1m] @ 1795341600)`,
		`telemetry_device_last_seen_timestamp_seconds`, `{device="truck_1"}`, `{__name__=~".+"}`,
	} {
		f.same(q, end, time.Hour)
		f.same(q, end, time.Hour)
	}
	// A step below a millisecond is refused, naming the parameter.
	v := url.Values{"query": {"velocity"}, "start": {fmt.Sprint(end.Unix())}, "end": {fmt.Sprint(end.Unix())}, "step": {"0.0001"}}
	rec := httptest.NewRecorder()
	f.cached.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/query_range?"+v.Encode(), nil))
	assert.Equal(t, http.StatusBadRequest, rec.Code)
	assert.Contains(t, rec.Body.String(), `invalid parameter \"step\": a step below 1ms`)
	s := f.cached.results.c.Stats()
	assert.Zero(t, s.Hits+s.Partial+s.Misses+s.Kept, "%+v", s)

	limited, err := New(Config{Source: f.st, Visible: func(context.Context) func(buckets.DeviceID) bool {
		return func(d buckets.DeviceID) bool { return d == "truck_1" }
	}})
	require.NoError(t, err)
	f.ask(limited, `velocity`, end, time.Hour)
	assert.NotContains(t, f.ask(limited, `velocity`, end, time.Hour), "truck_2")
	s = limited.results.c.Stats()
	assert.Zero(t, s.Hits+s.Partial+s.Misses+s.Kept, "%+v", s)
}
