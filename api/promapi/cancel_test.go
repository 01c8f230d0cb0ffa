package promapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// cancelingSource ends the query's context at its first read of
// readings (Range) or of the device list (Devices), whichever onRange
// chooses, and counts the reads made after that: a query that honours
// its context makes at most the one in progress.
type cancelingSource struct {
	*memSource
	onRange bool
	cancel  context.CancelFunc

	mu           sync.Mutex
	canceled     bool
	readsAfter   int
	devicesAfter int
}

func (s *cancelingSource) trip(devices bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.canceled {
		if devices {
			s.devicesAfter++
		} else {
			s.readsAfter++
		}
		return
	}
	if s.onRange != devices {
		s.canceled = true
		s.cancel()
	}
}

func (s *cancelingSource) Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error) {
	s.trip(false)
	return s.memSource.Range(ctx, q)
}

func (s *cancelingSource) Devices(ctx context.Context, q buckets.DeviceQuery) ([]buckets.DeviceInfo, bool, error) {
	s.trip(true)
	return s.memSource.Devices(ctx, q)
}

func isCanceled(err error) bool {
	var qc promql.ErrQueryCanceled
	return errors.As(err, &qc) || errors.Is(err, context.Canceled)
}

// TestQueryStopsAtItsContext: a query whose context ends while it reads
// stops reading: within the series it is reading (a range function over
// a long range, a subquery over a selector, a range query, a short
// select of more than one page), between series and between pages of a
// long device listing, and it answers with the cancellation, not a
// result. Before, the engine looked at its context only between
// series and between steps of the outer query, so an instant query
// read every page of the series and returned its result after its
// deadline (a rule past its timeout reported no error).
func TestQueryStopsAtItsContext(t *testing.T) {
	const n = 20000 // readings of d1, one a second; 200 pages of 100
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	end := t0.Add(n * time.Second)
	src := newMemSource()
	rs := make([]buckets.Reading, n)
	for i := range rs {
		rs[i] = buckets.Reading{Ticks: buckets.MustTicks(t0.Add(time.Duration(i) * time.Second)),
			Values: []buckets.Field{{Name: "temp", Value: buckets.Float(float64(i % 50))}}}
	}
	src.add("d1", nil, rs...)
	for d := range 3500 { // four pages of devices
		src.add(buckets.DeviceID(fmt.Sprintf("e%04d", d)), nil, buckets.Reading{Ticks: buckets.MustTicks(end),
			Values: []buckets.Field{{Name: "temp", Value: buckets.Float(1)}}})
	}

	for name, tc := range map[string]struct {
		query   string
		onRange bool // cancel at the first read of readings, else of devices
		rng     bool // a range query from t0 to end
	}{
		"range function over a long range": {`max_over_time(temp{device="d1"}[1d])`, true, false},
		"subquery over a selector":         {`max_over_time(temp{device="d1"}[6h:2s])`, true, false},
		"range query":                      {`temp{device="d1"}`, true, true},
		"a listing of many devices":        {`sum(temp)`, false, false},
		// Short reads: the lean engine, which looks at the context
		// between series only (TestShortReads).
		"a short range function":                 {`avg_over_time(temp{device="d1"}[5m])`, true, false},
		"a selector of one device":               {`temp{device="d1"}`, true, false},
		"a short range function of many devices": {`avg_over_time(temp[5m])`, true, false},
		"a selector of many devices":             {`temp`, true, false},
	} {
		t.Run(name, func(t *testing.T) {
			a, err := New(Config{Source: src, Now: func() time.Time { return end }})
			require.NoError(t, err)
			a.q.pageSize = 100
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cs := &cancelingSource{memSource: src, onRange: tc.onRange, cancel: cancel}
			a.q.src = cs

			if tc.rng {
				qry, err := a.newRangeQuery(context.Background(), tc.query, t0, end, time.Second)
				require.NoError(t, err)
				res := qry.Exec(ctx)
				qry.Close()
				err = res.Err
				require.Error(t, err, "the query answered after its context ended")
				assert.True(t, isCanceled(err), "%v", err)
			} else {
				_, err = a.Instant(ctx, tc.query, end)
				require.Error(t, err, "the query answered after its context ended")
				assert.True(t, isCanceled(err), "%v", err)
			}
			cs.mu.Lock()
			defer cs.mu.Unlock()
			require.True(t, cs.canceled, "the query never read")
			assert.Zero(t, cs.readsAfter, "pages of readings read after the context ended")
			assert.Zero(t, cs.devicesAfter, "pages of devices listed after the context ended")
		})
	}
}

// TestShortReads: the instant queries that read at most a lookback
// delta of each series, outside subqueries, go to the lean engine.
func TestShortReads(t *testing.T) {
	a, err := New(Config{Source: newMemSource()})
	require.NoError(t, err)
	for q, want := range map[string]bool{
		`temp`:                      true,
		`avg by (fleet) (temp) > 3`: true,
		`avg_over_time(temp[5m])`:   true,
		`time() - telemetry_device_last_seen_timestamp_seconds > 600`: true,
		`avg_over_time(temp[5m1s])`:                                   false,
		`max_over_time(temp[1d])`:                                     false,
		`max_over_time(temp[1m:10s])`:                                 false,
		`temp > on(device) max_over_time(x[2h])`:                      false,
	} {
		expr, err := a.parser.ParseExpr(q)
		require.NoError(t, err)
		assert.Equal(t, want, a.shortReads(expr), q)
	}
}
