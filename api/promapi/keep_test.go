package promapi

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// TestKeepValues: an instant query of a SharedReads batch made with
// KeepValues answers, once the live window holds the devices, exactly
// the series of the whole answer that keep accepts, when the query is a
// selector (or a selector and a number or time() joined by + - * /),
// with the values of the whole answer; any other query answers whole.
// Values at the boundary of keep, a selector of two names, the
// last-seen series and an evaluation time within a millisecond are
// among the cases.
func TestKeepValues(t *testing.T) {
	f := newLiveFixture(t, 5) // temp 24+d, hum 44 at 09:45, the last readings
	ts := f.t0.Add(10*time.Minute + 700*time.Microsecond)
	warm := SharedReads(context.Background())
	for _, q := range []string{`temp`, `hum`} { // the live window takes in every device
		_, err := f.shared.Instant(warm, q, ts)
		require.NoError(t, err)
	}
	above := func(n float64) func(float64) bool { return func(v float64) bool { return v > n } }
	below := func(n float64) func(float64) bool { return func(v float64) bool { return v < n } }
	for _, c := range []struct {
		expr     string
		keep     func(float64) bool
		filtered bool // the answer holds only what keep accepts
		n        int  // series keep accepts
	}{
		{`temp`, above(26), true, 2},
		{`(temp)`, above(26), true, 2},
		{`temp{device=~"d[0-3]"}`, below(26), true, 2},
		{`temp * 2`, above(52), true, 2},
		{`2 * temp`, above(52), true, 2},
		{`100 - temp`, below(74), true, 2},
		{`temp - 100`, above(-74), true, 2},
		{`temp / 2`, above(13), true, 2},
		{`1 / temp`, above(1.0 / 26), true, 2},
		{`temp + 0.5`, above(26.5), true, 2},
		{`{__name__=~"temp|hum"}`, above(27), true, 6}, // hum 44 and d4's temp
		{`time() - telemetry_device_last_seen_timestamp_seconds`, above(14.9995), true, 5},
		{`time() - telemetry_device_last_seen_timestamp_seconds`, above(15), true, 0}, // time() is whole ms
		{`telemetry_device_last_seen_timestamp_seconds`, below(0), true, 0},
		{`temp != 26`, above(26), false, 2},
		{`-temp`, below(-26), false, 2},
		{`temp offset 1m`, above(20), false, 5},
		{`avg_over_time(temp[5m])`, above(25), false, 2},
		{`time() - timestamp(temp)`, above(0), false, 5},
		{`{__name__=~"temp|hum"} * 2`, above(0), false, 0}, // an error, both ways
	} {
		want, wantErr := f.plain.Instant(context.Background(), c.expr, ts)
		got, err := f.shared.Instant(KeepValues(SharedReads(context.Background()), c.keep), c.expr, ts)
		if wantErr != nil {
			require.Error(t, err, c.expr)
			assert.Equal(t, wantErr.Error(), err.Error(), c.expr)
			continue
		}
		require.NoError(t, err, c.expr)
		kept := keptOf(want, c.keep)
		assert.Len(t, kept, c.n, c.expr)
		assert.Equal(t, normVector(kept), normVector(keptOf(got, c.keep)), c.expr)
		if c.filtered {
			assert.Equal(t, normVector(kept), normVector(got), "%s: only what keep accepts", c.expr)
		} else {
			assert.Equal(t, normVector(want), normVector(got), "%s: the whole answer", c.expr)
		}
	}

	// Without the batch, or without the live window's samples (a
	// device it does not hold yet), the answer is whole.
	got, err := f.shared.Instant(KeepValues(context.Background(), above(26)), `temp`, ts)
	require.NoError(t, err)
	assert.Len(t, got, 5)
	f.write(f.reading("d9", f.t0.Add(9*time.Minute), 1, 1))
	got, err = f.shared.Instant(KeepValues(SharedReads(context.Background()), above(26)), `temp`, ts)
	require.NoError(t, err)
	assert.Len(t, got, 3, "d3, d4 and d9, read from the store")
	got, err = f.shared.Instant(KeepValues(SharedReads(context.Background()), above(26)), `temp`, ts)
	require.NoError(t, err)
	assert.Len(t, got, 2, "d9 held by the window since")
}

// TestKeepValuesCountsEverySeries: the bound on the series a selector
// matches counts the series left out too.
func TestKeepValuesCountsEverySeries(t *testing.T) {
	f := newLiveFixture(t, 5)
	ts := f.t0.Add(10 * time.Minute)
	for _, limit := range []int{4, 5} {
		api, err := New(Config{Source: f.src, MaxSeries: limit, Now: func() time.Time { return ts }})
		require.NoError(t, err)
		for _, q := range []string{`temp{device=~"d[0-3]"}`, `temp{device="d4"}`} { // the window takes in the devices
			_, err = api.Instant(SharedReads(context.Background()), q, ts)
			require.NoError(t, err)
		}
		got, err := api.Instant(KeepValues(SharedReads(context.Background()), func(v float64) bool { return v > 27 }), `temp`, ts)
		if limit == 4 {
			require.ErrorIs(t, err, errTooManySeries, "5 series matched, 1 kept")
			continue
		}
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.Equal(t, buckets.DeviceID("d4"), buckets.DeviceID(got[0].Metric.Get("device")))
	}
}

func normVector(v promql.Vector) promql.Vector {
	if len(v) == 0 {
		return nil
	}
	return sortedVector(v)
}

func keptOf(v promql.Vector, keep func(float64) bool) promql.Vector {
	var out promql.Vector
	for _, s := range v {
		if s.H == nil && keep(s.F) && !math.IsNaN(s.F) {
			out = append(out, s)
		}
	}
	return out
}
