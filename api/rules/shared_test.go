package rules

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/promapi"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

func TestThresholdOf(t *testing.T) {
	for expr, want := range map[string]*threshold{
		`temp > 30`:                       {operand: "temp", op: parser.GTR, n: 30},
		`(avg_over_time(temp[5m])) <= -2`: {operand: "avg_over_time(temp[5m])", op: parser.LTE, n: -2},
		`30 < temp{fleet="a"}`:            {operand: `temp{fleet="a"}`, op: parser.LSS, n: 30, swapped: true},
		`time() - last > 600`:             {operand: "time() - last", op: parser.GTR, n: 600},
		`temp > bool 30`:                  nil, // every series, 0 or 1
		`temp > humidity`:                 nil,
		`temp + 30`:                       nil,
		`1 > 2`:                           nil,
		`scalar(temp) > 1`:                nil,
		`temp > 30 and humidity > 2`:      nil,
		`temp >`:                          nil,
		`sum by (fleet) (humidity) == 80`: {operand: "sum by (fleet) (humidity)", op: parser.EQLC, n: 80},
		`max(temp) != -Inf`:               {operand: "max(temp)", op: parser.NEQ, n: math.Inf(-1)},
		`absent(temp) >= 1`:               {operand: "absent(temp)", op: parser.GTE, n: 1},
		`-temp < -35`:                     {operand: "-temp", op: parser.LSS, n: -35},
		`label_replace(temp, "x", "$1", "device", "(.*)") > 0`: {operand: `label_replace(temp, "x", "$1", "device", "(.*)")`, op: parser.GTR, n: 0},
	} {
		assert.Equal(t, want, thresholdOf(expr), expr)
	}
}

// TestThresholdsAnswerAsTheEngine: over the service's engine and a
// real store, a threshold answered from its shared operand is exactly
// what the whole expression answers (values, labels, the metric name
// kept), and each operand is queried once for every rule that compares
// it; the same in a batch with Config.Keep, where the operand's answer
// holds only the series some threshold on it keeps.
func TestThresholdsAnswerAsTheEngine(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	o := store.DefaultOptions()
	o.Logger = slog.New(slog.DiscardHandler)
	o.Now = func() time.Time { return t0 }
	st, err := store.Open(t.Context(), t.TempDir(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	temps := map[string][]float64{"a": {10, 20, 30, 40, 45, 50}, "b": {35, 35, 35, 35, 35, 35}, "c": {-5, -5, -5, -5, -5, -5}}
	var rs []buckets.Reading
	for i := range 6 {
		for _, d := range []string{"a", "b", "c"} {
			r := buckets.Reading{Device: buckets.DeviceID(d), Ticks: buckets.MustTicks(t0.Add(time.Duration(i) * 15 * time.Second)),
				Values: []buckets.Field{{Name: "temp", Value: buckets.Float(temps[d][i])}}}
			if d == "a" {
				r.Values = append([]buckets.Field{{Name: "humidity", Value: buckets.Float(80 + float64(i))}}, r.Values...)
			}
			rs = append(rs, r)
		}
	}
	require.NoError(t, st.Write(t.Context(), rs))
	for d, fleet := range map[string]string{"a": "x", "b": "x", "c": "y"} {
		set, bad := buckets.NewAttributes(map[string]string{"fleet": fleet})
		require.Nil(t, bad)
		require.NoError(t, st.Assign(t.Context(), []buckets.Assignment{{Device: buckets.DeviceID(d), At: buckets.MustTicks(t0), Set: set}}))
	}
	api, err := promapi.New(promapi.Config{Source: st, Now: func() time.Time { return t0 }})
	require.NoError(t, err)
	query := func(ctx context.Context, expr string, ts time.Time) (promql.Vector, error) {
		return api.Instant(ctx, expr, ts)
	}
	exprs := []string{
		`temp > 30`, `temp > 35`, `temp < 35`, `temp >= 35`, `30 < temp`, `35 > temp`, `35 == temp`, `temp != 35`, `temp <= -5`,
		`avg_over_time(temp[1m]) > 20`, `-temp < -30`, `(temp) > 0`, `avg by (fleet) (temp) > 10`,
		`time() - timestamp(temp) > 10`, `humidity > 82`, `absent(nothing) >= 1`, `humidity * 2 < 100`,
	}
	queried := map[string]int{}
	counting := func(ctx context.Context, expr string, ts time.Time) (promql.Vector, error) {
		queried[expr]++
		return query(ctx, expr, ts)
	}
	thrs := make([]*threshold, len(exprs))
	for i, expr := range exprs {
		thrs[i] = thresholdOf(expr)
		require.NotNil(t, thrs[i], expr)
	}
	shareOperands(thrs)
	// Alone, and as a group evaluation does: in a batch, each operand
	// queried with the group's thresholds on it (Config.Keep).
	for _, batched := range []bool{false, true} {
		var keep func(context.Context, func(float64) bool) context.Context
		if batched {
			keep = promapi.KeepValues
		}
		for _, at := range []time.Duration{0, 30 * time.Second, 45 * time.Second, time.Minute, 75 * time.Second, 10 * time.Minute} {
			ts := t0.Add(at)
			ctx := t.Context()
			if batched {
				ctx = promapi.SharedReads(ctx)
			}
			ops := operands{}
			clear(queried)
			for i, expr := range exprs {
				got, ok, err := ops.query(ctx, counting, keep, thrs[i], ts)
				require.NoError(t, err, expr)
				require.True(t, ok)
				want, err := query(t.Context(), expr, ts)
				require.NoError(t, err, expr)
				assert.Equal(t, sortSamples(want), sortSamples(got), "%s at %s", expr, at)
			}
			for op, n := range queried {
				assert.Equal(t, 1, n, "%s queried once at %s", op, at)
			}
			assert.Len(t, queried, 8, "temp, avg_over_time, -temp, avg by, time() - timestamp, humidity, absent, humidity * 2")
			if at == 75*time.Second { // a's humidity 85 (170 < 100 is false), its newest reading
				if batched {
					assert.Empty(t, ops["humidity * 2"], "the engine was handed only what the thresholds keep")
				} else {
					assert.Len(t, ops["humidity * 2"], 1)
				}
			}
		}
	}
}

func sortSamples(v promql.Vector) promql.Vector {
	if len(v) == 0 {
		return nil
	}
	out := slices.Clone(v)
	slices.SortFunc(out, func(a, b promql.Sample) int { return labels.Compare(a.Metric, b.Metric) })
	return out
}
