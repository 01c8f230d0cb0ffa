package promapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestThinLastMatchesRawReadings asks last_over_time range queries of
// an API that gives the engine only the samples it looks at and of one
// that reads every raw reading: the same answers, whatever the range,
// step, alignment, offset or subquery, over a device with a gap.
func TestThinLastMatchesRawReadings(t *testing.T) {
	f := newRangeFixture(t)
	var rs = f.reading("truck_9", f.t0.Add(17*time.Minute+3*time.Second), 4)
	f.write(rs, f.reading("truck_9", f.t0.Add(80*time.Minute), 5), f.reading("truck_9", f.t0.Add(80*time.Minute+500*time.Millisecond), 6))
	raw, err := New(Config{Source: f.st, ResultCacheBytes: -1})
	require.NoError(t, err)
	raw.q.noPushdown = true
	thin, err := New(Config{Source: f.st, ResultCacheBytes: -1})
	require.NoError(t, err)
	ask := func(a *API, q string, start, end time.Time, step string) string {
		v := url.Values{"query": {q}, "start": {fmt.Sprint(float64(start.UnixMilli()) / 1000)}, "end": {fmt.Sprint(float64(end.UnixMilli()) / 1000)}, "step": {step}}
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/query_range?"+v.Encode(), nil))
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		return rec.Body.String()
	}
	end := f.t0.Add(100 * time.Minute)
	for _, q := range []string{
		`last_over_time(velocity[1h])`, `last_over_time(velocity[30s])`, `last_over_time(velocity[25m])`,
		`last_over_time(velocity[1h] offset 5m)`, `max_over_time(last_over_time(velocity[1h])[30m:1m])`,
		`last_over_time(velocity[1h]) >= 0.9 * last_over_time(velocity[10m])`,
	} {
		for _, step := range []string{"10", "60", "7", "0.5"} {
			for _, start := range []time.Time{end.Add(-time.Hour), end.Add(-time.Hour + 3*time.Second + 250*time.Millisecond)} {
				if step == "0.5" {
					start = end.Add(-2 * time.Minute)
				}
				want := ask(raw, q, start, end, step)
				assert.Equal(t, want, ask(thin, q, start, end, step), "%s step %s from %s", q, step, start.Format(time.TimeOnly))
			}
		}
	}
}

func TestThinLast(t *testing.T) {
	ss := []sample{{10, 1}, {20, 2}, {25, 3}, {40, 4}, {90, 5}}
	assert.Equal(t, []sample{{10, 1}, {25, 3}, {40, 4}}, thinLast(ss, lastEnds{first: 10, step: 15, last: 85}))
	assert.Equal(t, []sample{{40, 4}, {90, 5}}, thinLast(ss, lastEnds{first: 50, step: 50, last: 100}))
	assert.Nil(t, thinLast(ss, lastEnds{first: 0, step: 5, last: 9}))
}
