package promapi

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// countingSource is an in-memory Source that records which devices
// were read and which device listings were made.
type countingSource struct {
	mu       sync.Mutex
	devs     []buckets.DeviceInfo
	readings map[buckets.DeviceID][]buckets.Reading
	ranges   map[buckets.DeviceID]int
	listings []string // prefixes listed with limit > 1
}

func newCountingSource(n int, now time.Time) *countingSource {
	s := &countingSource{readings: map[buckets.DeviceID][]buckets.Reading{}, ranges: map[buckets.DeviceID]int{}}
	k := buckets.MustTicks(now.Add(-time.Minute))
	for i := range n {
		dev := buckets.DeviceID(fmt.Sprintf("dev-%d", i))
		vals := []buckets.Field{{Name: "temp", Value: buckets.Float(float64(i))}}
		s.devs = append(s.devs, buckets.DeviceInfo{Device: dev, FirstSeen: k, LastSeen: k, Latest: vals})
		s.readings[dev] = []buckets.Reading{{Device: dev, Ticks: k, Values: vals}}
	}
	// sorted by ID, as the index answers
	for i := 1; i < len(s.devs); i++ {
		for j := i; j > 0 && s.devs[j].Device < s.devs[j-1].Device; j-- {
			s.devs[j], s.devs[j-1] = s.devs[j-1], s.devs[j]
		}
	}
	return s
}

func (s *countingSource) Devices(_ context.Context, q buckets.DeviceQuery) ([]buckets.DeviceInfo, bool, error) {
	prefix, after, limit := q.Prefix, q.After, q.Limit
	s.mu.Lock()
	defer s.mu.Unlock()
	if limit > 1 {
		s.listings = append(s.listings, prefix)
	}
	var out []buckets.DeviceInfo
	for _, d := range s.devs {
		if strings.HasPrefix(string(d.Device), prefix) && d.Device > after && selects(q, &d) {
			if len(out) == limit {
				return out, true, nil
			}
			out = append(out, d)
		}
	}
	return out, false, nil
}

func (s *countingSource) Range(_ context.Context, q buckets.RangeQuery) (buckets.Page, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ranges[q.Device]++
	var out []buckets.Reading
	for _, r := range s.readings[q.Device] {
		if r.Ticks >= q.From && r.Ticks < q.To && (q.After == nil || r.Ticks > *q.After) {
			out = append(out, r)
		}
	}
	return buckets.Page{Readings: out}, nil
}

func TestMatchersPushDown(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		query     string
		readOnly  []string
		listed    []string // device listings made (prefixes)
		wantCount int
	}{
		{`temp{device="dev-1"}`, []string{"dev-1"}, nil, 1},
		{`temp{device=~"dev-1|dev-7"}`, []string{"dev-1", "dev-7"}, nil, 2},
		{`temp{device=~"dev-4.*"}`, []string{"dev-4", "dev-40", "dev-41", "dev-42", "dev-43", "dev-44", "dev-45", "dev-46", "dev-47", "dev-48", "dev-49"}, []string{"dev-4"}, 11},
		{`temp{device="nope"}`, nil, nil, 0},
		{`humidity`, nil, []string{""}, 0},
	} {
		t.Run(tc.query, func(t *testing.T) {
			src := newCountingSource(100, now)
			a, err := New(Config{Source: src, Now: func() time.Time { return now }})
			require.NoError(t, err)
			rec := httptest.NewRecorder()
			a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/query?"+url.Values{"query": {tc.query}}.Encode(), nil))
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			assert.Equal(t, tc.wantCount, strings.Count(rec.Body.String(), `"device":`), rec.Body.String())
			var read []string
			for d := range src.ranges {
				read = append(read, string(d))
			}
			assert.ElementsMatch(t, tc.readOnly, read, "devices whose readings were read")
			assert.Equal(t, tc.listed, src.listings, "device listings")
		})
	}
}

func TestVisibleHidesDevices(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	src := newCountingSource(20, now)
	a, err := New(Config{Source: src, Now: func() time.Time { return now },
		Visible: func(context.Context) func(buckets.DeviceID) bool {
			return func(d buckets.DeviceID) bool { return strings.HasPrefix(string(d), "dev-1") }
		}})
	require.NoError(t, err)
	for _, path := range []string{
		"/api/v1/label/device/values",
		"/api/v1/series?match[]=temp",
		"/api/v1/query?query=temp",
		`/api/v1/query?query=` + url.QueryEscape(`temp{device="dev-2"}`),
	} {
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		assert.NotContains(t, rec.Body.String(), `"dev-2"`, path)
		assert.NotContains(t, rec.Body.String(), `"dev-0"`, path)
		if !strings.Contains(path, "dev-2") {
			assert.Contains(t, rec.Body.String(), `"dev-13"`, path)
		}
	}
	assert.NotContains(t, src.ranges, buckets.DeviceID("dev-2"), "an invisible device is never read")
}

func TestTooManySeries(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	src := newCountingSource(11, now)
	a, err := New(Config{Source: src, MaxSeries: 10, Now: func() time.Time { return now }})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/query?query=temp", nil))
	assert.Equal(t, http.StatusUnprocessableEntity, rec.Code)
	assert.Contains(t, rec.Body.String(), `"errorType":"execution"`)
	assert.Contains(t, rec.Body.String(), "more than 10 series")
	src = newCountingSource(10, now)
	a, err = New(Config{Source: src, MaxSeries: 10, Now: func() time.Time { return now }})
	require.NoError(t, err)
	rec = httptest.NewRecorder()
	a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/query?query=temp", nil))
	assert.Equal(t, http.StatusOK, rec.Code, "exactly MaxSeries is allowed")
}
