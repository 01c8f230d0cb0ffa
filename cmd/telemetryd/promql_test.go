package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
)

// promFixture is a store with one detailed device (d1, a reading every
// 10 s for 6 hours) and 100 more devices with a few temperatures each.
type promFixture struct {
	env  *dashEnv
	api  v1.API
	now  time.Time
	d1   []promSample // temp of d1, oldest first
	ok   []promSample // ok (bool) of d1
	last map[string]float64
	devs map[string][]promSample // temp of dev-000..dev-099
}

type promSample struct {
	t time.Time
	v float64
}

func newPromFixture(t *testing.T) *promFixture {
	t.Helper()
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	f := &promFixture{env: newDashEnv(t, now), now: now, last: map[string]float64{}, devs: map[string][]promSample{}}
	rng := rand.New(rand.NewPCG(7, 7))
	var rs []buckets.Reading
	for i := range 6 * 360 {
		ts := now.Add(-6 * time.Hour).Add(time.Duration(i) * 10 * time.Second)
		temp := math.Round((20+5*math.Sin(float64(i)/50)+rng.Float64())*1000) / 1000
		ok := rng.IntN(3) == 0
		f.d1 = append(f.d1, promSample{ts, temp})
		f.ok = append(f.ok, promSample{ts, map[bool]float64{true: 1, false: 0}[ok]})
		rs = append(rs, newReading("d1", buckets.MustTicks(ts),
			buckets.Field{Name: "temp", Value: buckets.Float(temp)},
			buckets.Field{Name: "hum", Value: buckets.Int(int64(40 + i%20))},
			buckets.Field{Name: "ok", Value: buckets.Bool(ok)},
			buckets.Field{Name: "state", Value: buckets.String("idle")},
			buckets.Field{Name: "cpu.usage_idle", Value: buckets.Float(float64(i % 100))}))
	}
	f.last["d1"] = f.d1[len(f.d1)-1].v
	for d := range 100 {
		dev := fmt.Sprintf("dev-%03d", d)
		for j := range 20 { // every 30 s over the last 10 minutes
			ts := now.Add(-10 * time.Minute).Add(time.Duration(j) * 30 * time.Second)
			v := math.Round(rng.Float64()*10000) / 100
			rs = append(rs, newReading(dev, buckets.MustTicks(ts), buckets.Field{Name: "temp", Value: buckets.Float(v)}))
			f.last[dev] = v
			f.devs[dev] = append(f.devs[dev], promSample{ts, v})
		}
	}
	f.env.write(t, rs...)
	client, err := promapi.NewClient(promapi.Config{Address: f.env.base})
	require.NoError(t, err)
	f.api = v1.NewAPI(client)
	return f
}

// latestAt is the Prometheus instant-selector value at t: the newest
// sample in (t-5m, t].
func latestAt(ss []promSample, t time.Time) (float64, bool) {
	for i := len(ss) - 1; i >= 0; i-- {
		if !ss[i].t.After(t) {
			if ss[i].t.After(t.Add(-5 * time.Minute)) {
				return ss[i].v, true
			}
			return 0, false
		}
	}
	return 0, false
}

// avgOver is avg_over_time over (t-r, t].
func avgOver(ss []promSample, t time.Time, r time.Duration) (float64, bool) {
	sum, n := 0.0, 0
	for _, s := range ss {
		if s.t.After(t.Add(-r)) && !s.t.After(t) {
			sum += s.v
			n++
		}
	}
	return sum / float64(n), n > 0
}

func TestPromQLWithPrometheusClient(t *testing.T) {
	inLane(t, lanes.general)
	f := newPromFixture(t)
	ctx := context.Background()

	t.Run("query_range of a selector", func(t *testing.T) {
		r := v1.Range{Start: f.now.Add(-2 * time.Hour), End: f.now.Add(-1 * time.Hour), Step: 45 * time.Second}
		val, _, _, err := f.api.QueryRange(ctx, `temp{device="d1"}`, r)
		require.NoError(t, err)
		m, ok := val.(model.Matrix)
		require.True(t, ok, "%T", val)
		require.Len(t, m, 1)
		assert.Equal(t, model.LabelValue("d1"), m[0].Metric["device"])
		assert.Equal(t, model.LabelValue("temp"), m[0].Metric["__name__"])
		var want []model.SamplePair
		for ts := r.Start; !ts.After(r.End); ts = ts.Add(r.Step) {
			if v, ok := latestAt(f.d1, ts); ok {
				want = append(want, model.SamplePair{Timestamp: model.TimeFromUnixNano(ts.UnixNano()), Value: model.SampleValue(v)})
			}
		}
		require.Len(t, want, 81)
		assert.Equal(t, want, m[0].Values)
	})

	t.Run("avg_over_time", func(t *testing.T) {
		r := v1.Range{Start: f.now.Add(-5 * time.Hour), End: f.now, Step: 15 * time.Minute}
		val, _, _, err := f.api.QueryRange(ctx, `avg_over_time(temp{device="d1"}[1h])`, r)
		require.NoError(t, err)
		m := val.(model.Matrix)
		require.Len(t, m, 1)
		require.Len(t, m[0].Values, 21)
		for i, p := range m[0].Values {
			ts := r.Start.Add(time.Duration(i) * r.Step)
			want, ok := avgOver(f.d1, ts, time.Hour)
			require.True(t, ok)
			assert.Equal(t, ts.UnixMilli(), int64(p.Timestamp))
			assert.InDelta(t, want, float64(p.Value), 1e-9, "at %s", ts)
		}
	})

	t.Run("windowed functions answered from summaries match the raw readings", func(t *testing.T) {
		// step >= range and a step-aligned start: each window is read from
		// the store's summaries; readings lie on window boundaries.
		fns := map[string]func([]float64) float64{
			"avg_over_time": func(v []float64) float64 {
				s := 0.0
				for _, x := range v {
					s += x
				}
				return s / float64(len(v))
			},
			"sum_over_time": func(v []float64) float64 {
				s := 0.0
				for _, x := range v {
					s += x
				}
				return s
			},
			"min_over_time": func(v []float64) float64 { return slices.Min(v) },
			"max_over_time": func(v []float64) float64 { return slices.Max(v) },
		}
		for fn, ref := range fns {
			for _, c := range []struct{ rng, step time.Duration }{
				{time.Hour, time.Hour}, {10 * time.Minute, 30 * time.Minute}, {90 * time.Second, 90 * time.Second}, // one store call per series
				{90 * time.Second, time.Hour}, {1500 * time.Millisecond, 20 * time.Minute}, // one store call per window
			} {
				r := v1.Range{Start: f.now.Add(-5 * time.Hour).Truncate(c.step), End: f.now, Step: c.step}
				q := fmt.Sprintf(`%s(temp{device="d1"}[%s])`, fn, model.Duration(c.rng))
				val, _, _, err := f.api.QueryRange(ctx, q, r)
				require.NoError(t, err, q)
				m := val.(model.Matrix)
				require.Len(t, m, 1, q)
				var want []model.SamplePair
				for ts := r.Start; !ts.After(r.End); ts = ts.Add(r.Step) {
					var vs []float64
					for _, s := range f.d1 {
						if ms := s.t.Truncate(time.Millisecond); ms.After(ts.Add(-c.rng)) && !ms.After(ts) {
							vs = append(vs, s.v)
						}
					}
					if len(vs) > 0 {
						want = append(want, model.SamplePair{Timestamp: model.TimeFromUnixNano(ts.UnixNano()), Value: model.SampleValue(ref(vs))})
					}
				}
				require.Len(t, m[0].Values, len(want), q)
				for i := range want {
					assert.Equal(t, want[i].Timestamp, m[0].Values[i].Timestamp, q)
					assert.InDelta(t, float64(want[i].Value), float64(m[0].Values[i].Value), 1e-9, "%s at %s", q, want[i].Timestamp)
				}
			}
		}
	})

	t.Run("windowed max by device across many devices", func(t *testing.T) {
		r := v1.Range{Start: f.now.Add(-12 * time.Minute), End: f.now, Step: time.Minute}
		val, _, _, err := f.api.QueryRange(ctx, `max by (device) (max_over_time(temp{device=~"dev-0.*"}[1m]))`, r)
		require.NoError(t, err)
		m := val.(model.Matrix)
		require.Len(t, m, 100)
		for _, s := range m {
			dev := string(s.Metric["device"])
			var want []model.SamplePair
			for ts := r.Start; !ts.After(r.End); ts = ts.Add(r.Step) {
				mx, n := math.Inf(-1), 0
				for _, p := range f.devs[dev] {
					if p.t.After(ts.Add(-time.Minute)) && !p.t.After(ts) {
						mx, n = math.Max(mx, p.v), n+1
					}
				}
				if n > 0 {
					want = append(want, model.SamplePair{Timestamp: model.TimeFromUnixNano(ts.UnixNano()), Value: model.SampleValue(mx)})
				}
			}
			assert.Equal(t, want, s.Values, dev)
		}
	})

	t.Run("max by device across 101 devices", func(t *testing.T) {
		val, _, _, err := f.api.Query(ctx, `max by (device) (temp)`, f.now)
		require.NoError(t, err)
		vec := val.(model.Vector)
		require.Len(t, vec, 101)
		got := map[string]float64{}
		for _, s := range vec {
			require.Len(t, s.Metric, 1, "only device survives the aggregation")
			got[string(s.Metric["device"])] = float64(s.Value)
		}
		assert.Equal(t, f.last, got)
	})

	t.Run("max over devices matched by regex", func(t *testing.T) {
		val, _, _, err := f.api.Query(ctx, `max(temp{device=~"dev-00.*"})`, f.now)
		require.NoError(t, err)
		vec := val.(model.Vector)
		require.Len(t, vec, 1)
		want := math.Inf(-1)
		for d := range 10 {
			want = math.Max(want, f.last[fmt.Sprintf("dev-%03d", d)])
		}
		assert.Equal(t, want, float64(vec[0].Value))
	})

	t.Run("bool as 0/1 and a value name with a dot", func(t *testing.T) {
		ts := f.now.Add(-90 * time.Minute)
		val, _, _, err := f.api.Query(ctx, `sum_over_time(ok{device="d1"}[1h])`, ts)
		require.NoError(t, err)
		want := 0.0
		for _, s := range f.ok {
			if s.t.After(ts.Add(-time.Hour)) && !s.t.After(ts) {
				want += s.v
			}
		}
		require.Len(t, val.(model.Vector), 1)
		assert.Equal(t, want, float64(val.(model.Vector)[0].Value))
		val, _, _, err = f.api.Query(ctx, `{"cpu.usage_idle", device="d1"}`, f.now)
		require.NoError(t, err)
		require.Len(t, val.(model.Vector), 1)
		assert.Equal(t, float64((6*360-1)%100), float64(val.(model.Vector)[0].Value))
	})

	t.Run("label values of device", func(t *testing.T) {
		vals, _, _, err := f.api.LabelValues(ctx, "device", nil, f.now.Add(-time.Hour), f.now)
		require.NoError(t, err)
		var want model.LabelValues
		for dev := range f.last {
			want = append(want, model.LabelValue(dev))
		}
		slices.Sort(want)
		assert.Equal(t, want, vals)

		vals, _, _, err = f.api.LabelValues(ctx, "device", []string{`hum`}, f.now.Add(-time.Hour), f.now)
		require.NoError(t, err)
		assert.Equal(t, model.LabelValues{"d1"}, vals)

		names, _, _, err := f.api.LabelValues(ctx, "__name__", []string{`{device="d1"}`}, f.now.Add(-time.Hour), f.now)
		require.NoError(t, err)
		assert.Equal(t, model.LabelValues{"cpu.usage_idle", "hum", "ok", "telemetry_device_last_seen_timestamp_seconds", "temp"}, names,
			"strings are not series; every device has its last-seen series")

		labels, _, _, err := f.api.LabelNames(ctx, nil, f.now.Add(-time.Hour), f.now)
		require.NoError(t, err)
		assert.Equal(t, model.LabelNames{"__name__", "device"}, labels)
	})

	t.Run("series", func(t *testing.T) {
		sets, _, _, err := f.api.Series(ctx, []string{`{device="d1"}`, `temp{device=~"dev-09[0-2]"}`}, f.now.Add(-time.Hour), f.now)
		require.NoError(t, err)
		var got []string
		for _, s := range sets {
			got = append(got, s.String())
		}
		assert.ElementsMatch(t, []string{
			`{__name__="cpu.usage_idle", device="d1"}`, `{__name__="hum", device="d1"}`,
			`{__name__="ok", device="d1"}`, `{__name__="temp", device="d1"}`,
			`{__name__="telemetry_device_last_seen_timestamp_seconds", device="d1"}`,
			`{__name__="temp", device="dev-090"}`, `{__name__="temp", device="dev-091"}`, `{__name__="temp", device="dev-092"}`,
		}, got)
		// A window before every device was seen lists none.
		sets, _, _, err = f.api.Series(ctx, []string{`temp`}, f.now.Add(-30*24*time.Hour), f.now.Add(-29*24*time.Hour))
		require.NoError(t, err)
		assert.Empty(t, sets)
	})

	t.Run("errors in the Prometheus shape", func(t *testing.T) {
		// The client's own decoding, over a transport that keeps the
		// body it decoded: Go's decoder matches keys regardless of case,
		// so the body's spelling is checked too.
		rec := &bodyRecorder{next: http.DefaultTransport}
		client, err := promapi.NewClient(promapi.Config{Address: f.env.base, RoundTripper: rec})
		require.NoError(t, err)
		_, _, _, err = v1.NewAPI(client).Query(ctx, `max by (device) (temp`, f.now)
		var perr *v1.Error
		require.True(t, errors.As(err, &perr), "%v", err)
		assert.Equal(t, v1.ErrBadData, perr.Type)
		assert.Equal(t, `invalid parameter "query": 1:22: parse error: unclosed left parenthesis`, perr.Msg)
		typ, msg := promErrorBody(t, rec.last)
		assert.Equal(t, "bad_data", typ)
		assert.Equal(t, perr.Msg, msg)

		_, _, _, err = f.api.QueryRange(ctx, `temp`, v1.Range{Start: f.now.Add(-30 * 24 * time.Hour), End: f.now, Step: time.Second})
		require.True(t, errors.As(err, &perr), "%v", err)
		assert.Equal(t, v1.ErrBadData, perr.Type)
		assert.Contains(t, perr.Msg, "11000 points")

		for _, tc := range []struct {
			path  string
			q     url.Values
			param string
		}{
			{"/api/v1/query_range", url.Values{"query": {"temp"}, "start": {"x"}, "end": {"1"}, "step": {"1"}}, "start"},
			{"/api/v1/query_range", url.Values{"query": {"temp"}, "start": {"1"}, "end": {"2"}, "step": {"0"}}, "step"},
			{"/api/v1/query_range", url.Values{"query": {"temp"}, "start": {"5"}, "end": {"2"}, "step": {"1"}}, "end"},
			{"/api/v1/query", url.Values{"query": {"temp"}, "time": {"yesterday"}}, "time"},
			{"/api/v1/query", url.Values{}, "query"},
			{"/api/v1/series", url.Values{}, "match[]"},
			{"/api/v1/series", url.Values{"match[]": {"{"}}, "match[]"},
			{"/api/v1/label/device/values", url.Values{"limit": {"-1"}}, "limit"},
		} {
			code, raw := f.env.getJSON(t, tc.path, tc.q, nil)
			require.Equal(t, http.StatusBadRequest, code, "%s %v: %s", tc.path, tc.q, raw)
			typ, msg := promErrorBody(t, raw)
			assert.Equal(t, "bad_data", typ)
			assert.Contains(t, msg, fmt.Sprintf("invalid parameter %q", tc.param))
		}
	})
}

// fixedTokens is an api.Tokens with one read token limited to dev-00*.
type fixedTokens struct{}

func (fixedTokens) Token(secret string) (*auth.Principal, bool) {
	if secret != "grafana-secret" {
		return nil, false
	}
	return auth.NewPrincipal("grafana", []auth.Scope{auth.ScopeRead}, []string{"dev-00*"}), true
}

// TestPromQLHidesDevicesOutsideToken: with auth, a token limited to
// device patterns sees only those devices through the query API.
func TestPromQLHidesDevicesOutsideToken(t *testing.T) {
	inLane(t, lanes.general)
	f := newPromFixture(t)
	f.env.auth = fixedTokens{}
	f.env.reopen(t)
	client, err := promapi.NewClient(promapi.Config{Address: f.env.base,
		RoundTripper: bearer{"grafana-secret", http.DefaultTransport}})
	require.NoError(t, err)
	api := v1.NewAPI(client)
	ctx := context.Background()
	want := model.LabelValues{}
	for d := range 10 {
		want = append(want, model.LabelValue(fmt.Sprintf("dev-%03d", d)))
	}

	vals, _, _, err := api.LabelValues(ctx, "device", nil, f.now.Add(-time.Hour), f.now)
	require.NoError(t, err)
	assert.Equal(t, want, vals)
	sets, _, _, err := api.Series(ctx, []string{`temp`}, f.now.Add(-time.Hour), f.now)
	require.NoError(t, err)
	assert.Len(t, sets, 10)
	val, _, _, err := api.Query(ctx, `max by (device) (temp)`, f.now)
	require.NoError(t, err)
	assert.Len(t, val.(model.Vector), 10)
	val, _, _, err = api.Query(ctx, `temp{device="d1"}`, f.now)
	require.NoError(t, err)
	assert.Empty(t, val.(model.Vector), "d1 is outside the token's patterns")

	// Without the token: 401.
	code, _ := f.env.getJSON(t, "/api/v1/label/device/values", nil, nil)
	assert.Equal(t, http.StatusUnauthorized, code)
}

// bodyRecorder keeps the body of the last answer that went through it.
type bodyRecorder struct {
	next http.RoundTripper
	last []byte
}

func (b *bodyRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if b.last, err = io.ReadAll(resp.Body); err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b.last))
	return resp, nil
}

// promErrorBody returns the errorType and error of an error answer of
// the Prometheus API and fails unless its keys are exactly status,
// errorType and error as Prometheus spells them: Go's decoder, and so
// the Prometheus Go client, matches keys regardless of case, Grafana's
// browser side does not.
func promErrorBody(t testing.TB, raw []byte) (typ, msg string) {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m), "%s", raw)
	require.ElementsMatch(t, []string{"status", "errorType", "error"}, slices.Collect(maps.Keys(m)), "%s", raw)
	require.Equal(t, "error", m["status"], "%s", raw)
	typ, _ = m["errorType"].(string)
	msg, _ = m["error"].(string)
	return typ, msg
}

// bearer adds an Authorization header to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}
