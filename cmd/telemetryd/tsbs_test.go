package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	lp "github.com/influxdata/line-protocol/v2/lineprotocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fleet questions of TSBS's IoT use case (api/FLEET-QUERIES.md),
// asked of TSBS data written through /api/v2/write with
// -line-device-tags name, each answer checked against the same
// computation done here over the raw lines, with PromQL's windows:
// a range [r] at t holds the samples in (t-r, t]; a subquery [r:s] at t
// is evaluated at the multiples of s in (t-r, t].

// tsbsSample is the checked-in TSBS IoT data (testdata/tsbs/README.md):
// 10 trucks, 2026-11-22 10:00 to 11:00 at 10 s.
const tsbsSample = "testdata/tsbs/iot-10x1h.txt.gz"

// tsbsAt is when the questions are asked: just after the sample's last
// lines (10:59:50), on a 10-minute boundary.
var tsbsAt = time.Date(2026, 11, 22, 11, 0, 0, 0, time.UTC)

// tsbsTruck is one truck as its lines describe it.
type tsbsTruck struct {
	attrs  map[string]string       // its tags but name: the newest value of each
	tagAt  map[string]time.Time    // when each attribute was last given
	series map[string][]promSample // "<measurement>_<field>" → samples, oldest first
	times  map[time.Time]bool      // distinct line times: its readings
}

// tsbsLines is the sample as parsed by the line protocol library the
// service uses.
type tsbsLines struct {
	body     []byte
	lines    int
	nameless int // lines without a name tag: no truck
	trucks   map[string]*tsbsTruck
}

func loadTSBSSample(t *testing.T) *tsbsLines {
	t.Helper()
	f, err := os.Open(tsbsSample)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	body, err := io.ReadAll(zr)
	require.NoError(t, err)
	d := &tsbsLines{body: body, trucks: map[string]*tsbsTruck{}}
	dec := lp.NewDecoderWithBytes(body)
	for dec.Next() {
		d.lines++
		m, err := dec.Measurement()
		require.NoError(t, err)
		meas := string(m)
		tags := map[string]string{}
		for {
			k, v, err := dec.NextTag()
			require.NoError(t, err)
			if k == nil {
				break
			}
			tags[string(k)] = string(v)
		}
		fields := map[string]float64{}
		for {
			k, v, err := dec.NextField()
			require.NoError(t, err)
			if k == nil {
				break
			}
			switch v.Kind() {
			case lp.Float:
				fields[string(k)] = v.FloatV()
			case lp.Int:
				fields[string(k)] = float64(v.IntV())
			default:
				t.Fatalf("line %d: field %s of kind %v: the sample has numbers only", d.lines, k, v.Kind())
			}
		}
		at, err := dec.Time(lp.Nanosecond, time.Time{})
		require.NoError(t, err)
		at = at.UTC()
		name, ok := tags["name"]
		if !ok {
			d.nameless++
			continue
		}
		tr := d.trucks[name]
		if tr == nil {
			tr = &tsbsTruck{attrs: map[string]string{}, tagAt: map[string]time.Time{}, series: map[string][]promSample{}, times: map[time.Time]bool{}}
			d.trucks[name] = tr
		}
		tr.times[at] = true
		for k, v := range tags {
			if k != "name" && !at.Before(tr.tagAt[k]) {
				tr.attrs[k], tr.tagAt[k] = v, at
			}
		}
		for k, v := range fields {
			tr.series[meas+"_"+k] = append(tr.series[meas+"_"+k], promSample{at, v})
		}
	}
	require.NoError(t, dec.Err())
	for _, tr := range d.trucks {
		for _, ss := range tr.series {
			slices.SortFunc(ss, func(a, b promSample) int { return a.t.Compare(b.t) })
		}
	}
	return d
}

// window is the values of ss in (at-r, at].
func window(ss []promSample, at time.Time, r time.Duration) []float64 {
	var out []float64
	for _, s := range ss {
		if s.t.After(at.Add(-r)) && !s.t.After(at) {
			out = append(out, s.v)
		}
	}
	return out
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// subqueryTimes are the evaluation times of a subquery [r:step] at at.
func subqueryTimes(at time.Time, r, step time.Duration) []time.Time {
	var out []time.Time
	for ts := at.Truncate(step); ts.After(at.Add(-r)); ts = ts.Add(-step) {
		out = append([]time.Time{ts}, out...)
	}
	return out
}

// splitBetween is a threshold with some of vs below it and some not
// (the middle between the two middle distinct values).
func splitBetween(t *testing.T, vs []float64) float64 {
	t.Helper()
	u := slices.Compact(slices.Sorted(slices.Values(vs)))
	require.GreaterOrEqual(t, len(u), 2, "the sample gives too few distinct values to split: %v", u)
	return (u[len(u)/2-1] + u[len(u)/2]) / 2
}

// promVector is an instant query's answer: labels (without __name__
// unless keepName) → value.
type promVector map[string]float64

// seriesKey renders labels in a fixed order.
func seriesKey(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q,", k, m[k])
	}
	return b.String()
}

// instant asks query at tsbsAt and returns its vector.
func (s *testService) instant(t *testing.T, query string) promVector {
	t.Helper()
	var r struct {
		Status string `json:"status"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	q := url.Values{"query": {query}, "time": {strconv.FormatInt(tsbsAt.Unix(), 10)}}
	code, body := s.get(t, "/api/v1/query?"+q.Encode(), &r)
	require.Equal(t, http.StatusOK, code, "%s: %s", query, body)
	require.Equal(t, "vector", r.Data.ResultType, query)
	out := promVector{}
	for _, x := range r.Data.Result {
		v, err := strconv.ParseFloat(x.Value[1].(string), 64)
		require.NoError(t, err)
		k := seriesKey(x.Metric)
		require.NotContains(t, out, k, "%s: two series with the labels %s", query, k)
		out[k] = v
	}
	return out
}

// assertVector compares got with want, values within a relative 1e-9
// (the service sums in another order than this test).
func assertVector(t *testing.T, query string, want, got promVector) {
	t.Helper()
	require.Equal(t, mapKeys(want), mapKeys(got), "series of %s", query)
	for k, w := range want {
		assert.InDelta(t, w, got[k], 1e-9*math.Max(1, math.Abs(w)), "%s: %s", query, k)
	}
}

// mapKeys is the keys of m, sorted.
func mapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// truckLabels are the labels of a truck's series: device, its
// attributes and, when name is set, __name__.
func truckLabels(dev string, tr *tsbsTruck, name string) map[string]string {
	m := map[string]string{"device": dev}
	for k, v := range tr.attrs {
		m[k] = v
	}
	if name != "" {
		m["__name__"] = name
	}
	return m
}

func TestTSBSFleetQuestions(t *testing.T) {
	d := loadTSBSSample(t)
	require.Len(t, d.trucks, 10)
	require.Positive(t, d.nameless)

	cfg := newTestConfig(t)
	cfg.LineDeviceTags = "name"
	s := startService(t, cfg)
	// One request of every line: the lines without a name are refused
	// (no device), the others stored.
	code, body := s.post(t, "/api/v2/write?bucket=fleet&precision=ns", d.body, nil)
	require.Equal(t, http.StatusBadRequest, code, body)
	_, msg := influxBody(t, body)
	assert.Contains(t, msg, fmt.Sprintf("partial write: %d of %d lines rejected", d.nameless, d.lines))
	for dev, tr := range d.trucks {
		waitStored(t, s, dev, len(tr.times))
	}

	t.Run("every truck has its tags as attributes", func(t *testing.T) {
		for dev, tr := range d.trucks {
			var got struct {
				Device     string            `json:"device"`
				Attributes map[string]string `json:"attributes"`
			}
			code, body := s.get(t, "/v1/devices/"+dev, &got)
			require.Equal(t, http.StatusOK, code, body)
			assert.Equal(t, dev, got.Device)
			assert.Equal(t, tr.attrs, got.Attributes, dev)
			assert.Len(t, got.Attributes, 4, "%s: fleet, driver, model, device_version", dev)
		}
	})

	// The fleet asked about: the one with the most trucks in the sample.
	byFleet := map[string]int{}
	for _, tr := range d.trucks {
		if f, ok := tr.attrs["fleet"]; ok {
			byFleet[f]++
		}
	}
	fleet := ""
	for f, n := range byFleet {
		if n > byFleet[fleet] || n == byFleet[fleet] && f < fleet {
			fleet = f
		}
	}
	require.Less(t, byFleet[fleet], len(d.trucks), "the sample must have trucks of other fleets too")
	inFleet := func(tr *tsbsTruck) bool { return tr.attrs["fleet"] == fleet }
	// last is the newest sample of name in (tsbsAt-2h, tsbsAt].
	last := func(tr *tsbsTruck, name string) (float64, bool) {
		w := window(tr.series[name], tsbsAt, 2*time.Hour)
		if len(w) == 0 {
			return 0, false
		}
		return w[len(w)-1], true
	}

	t.Run("last location per truck of a fleet", func(t *testing.T) {
		q := fmt.Sprintf(`last_over_time({__name__=~"readings_(latitude|longitude)",fleet=%q}[2h])`, fleet)
		want := promVector{}
		for dev, tr := range d.trucks {
			for _, name := range []string{"readings_latitude", "readings_longitude"} {
				if v, ok := last(tr, name); ok && inFleet(tr) {
					want[seriesKey(truckLabels(dev, tr, name))] = v
				}
			}
		}
		require.Len(t, want, 2*byFleet[fleet])
		assertVector(t, q, want, s.instant(t, q))
	})

	// lastFiltered is the trucks of the fleet whose newest value of name
	// keeps(value).
	lastFiltered := func(name string, keep func(v float64, tr *tsbsTruck) bool) promVector {
		want := promVector{}
		for dev, tr := range d.trucks {
			if v, ok := last(tr, name); ok && inFleet(tr) && keep(v, tr) {
				want[seriesKey(truckLabels(dev, tr, name))] = v
			}
		}
		return want
	}
	lastOfAll := func(name string) []float64 {
		var vs []float64
		for _, tr := range d.trucks {
			if v, ok := last(tr, name); ok {
				vs = append(vs, v)
			}
		}
		return vs
	}

	t.Run("low fuel", func(t *testing.T) {
		// 0.1 as TSBS asks (no truck of the hour is that low), and the
		// lowest latest fuel state of the sample.
		for _, limit := range []float64{0.1, slices.Min(lastOfAll("diagnostics_fuel_state"))} {
			q := fmt.Sprintf(`last_over_time(diagnostics_fuel_state{fleet=%q}[2h]) <= %s`, fleet, strconv.FormatFloat(limit, 'g', -1, 64))
			want := lastFiltered("diagnostics_fuel_state", func(v float64, _ *tsbsTruck) bool { return v <= limit })
			if limit != 0.1 {
				require.NotEmpty(t, want, q)
			}
			assertVector(t, q, want, s.instant(t, q))
		}
	})

	t.Run("high load", func(t *testing.T) {
		var shares []float64
		for _, tr := range d.trucks {
			l, ok1 := last(tr, "diagnostics_current_load")
			c, ok2 := last(tr, "diagnostics_load_capacity")
			if ok1 && ok2 {
				shares = append(shares, l/c)
			}
		}
		for _, share := range []float64{0.9, splitBetween(t, shares)} {
			sh := strconv.FormatFloat(share, 'g', -1, 64)
			q := fmt.Sprintf(`last_over_time(diagnostics_current_load{fleet=%q}[2h]) >= %s * last_over_time(diagnostics_load_capacity{fleet=%q}[2h])`, fleet, sh, fleet)
			want := lastFiltered("diagnostics_current_load", func(v float64, tr *tsbsTruck) bool {
				c, ok := last(tr, "diagnostics_load_capacity")
				return ok && v >= share*c
			})
			if share != 0.9 {
				require.NotEmpty(t, want, q)
			}
			assertVector(t, q, want, s.instant(t, q))
		}
	})

	// avg10m is avg_over_time(name[10m]) at at.
	avg10m := func(tr *tsbsTruck, name string, at time.Time) (float64, bool) {
		w := window(tr.series[name], at, 10*time.Minute)
		return mean(w), len(w) > 0
	}

	t.Run("stationary trucks", func(t *testing.T) {
		var all []float64
		for _, tr := range d.trucks {
			if v, ok := avg10m(tr, "readings_velocity", tsbsAt); ok {
				all = append(all, v)
			}
		}
		for _, limit := range []float64{1, splitBetween(t, all)} {
			q := fmt.Sprintf(`avg_over_time(readings_velocity{fleet=%q}[10m]) < %s`, fleet, strconv.FormatFloat(limit, 'g', -1, 64))
			want := promVector{}
			for dev, tr := range d.trucks {
				if v, ok := avg10m(tr, "readings_velocity", tsbsAt); ok && inFleet(tr) && v < limit {
					want[seriesKey(truckLabels(dev, tr, ""))] = v
				}
			}
			if limit != 1 {
				require.NotEmpty(t, want, q)
			}
			assertVector(t, q, want, s.instant(t, q))
		}
	})

	t.Run("long driving sessions", func(t *testing.T) {
		// TSBS: more than 22 of the 24 ten-minute periods of 4 hours with
		// a mean velocity above 1; over the sample's hour, more than 5 of
		// 6 (every truck of the hour). Then a speed and a count that
		// split the sample.
		periods := func(tr *tsbsTruck, speed float64) int {
			n := 0
			for _, at := range subqueryTimes(tsbsAt, time.Hour, 10*time.Minute) {
				if v, ok := avg10m(tr, "readings_velocity", at); ok && v > speed {
					n++
				}
			}
			return n
		}
		counts := func(speed float64) []float64 {
			var out []float64
			for _, tr := range d.trucks {
				out = append(out, float64(periods(tr, speed)))
			}
			return out
		}
		var speeds []float64
		for _, tr := range d.trucks {
			for _, at := range subqueryTimes(tsbsAt, time.Hour, 10*time.Minute) {
				if v, ok := avg10m(tr, "readings_velocity", at); ok {
					speeds = append(speeds, v)
				}
			}
		}
		slices.Sort(speeds)
		split := -1.0
		for _, v := range speeds {
			if len(slices.Compact(slices.Sorted(slices.Values(counts(v))))) >= 2 {
				split = v
				break
			}
		}
		require.GreaterOrEqual(t, split, 0.0, "no speed splits the sample's trucks")
		for _, c := range []struct{ speed, limit float64 }{{1, 5}, {split, math.Floor(splitBetween(t, counts(split)))}} {
			q := fmt.Sprintf(`count_over_time((avg_over_time(readings_velocity{fleet=%q}[10m]) > %s)[1h:10m]) > %g`,
				fleet, strconv.FormatFloat(c.speed, 'g', -1, 64), c.limit)
			want := promVector{}
			for dev, tr := range d.trucks {
				if n := periods(tr, c.speed); inFleet(tr) && float64(n) > c.limit {
					want[seriesKey(truckLabels(dev, tr, ""))] = float64(n)
				}
			}
			require.NotEmpty(t, want, q)
			assertVector(t, q, want, s.instant(t, q))
		}
	})

	// byFleetModel is the {fleet, model} labels of a truck (an absent
	// attribute is an absent label).
	byFleetModel := func(tr *tsbsTruck) string {
		m := map[string]string{}
		for _, k := range []string{"fleet", "model"} {
			if v, ok := tr.attrs[k]; ok {
				m[k] = v
			}
		}
		return seriesKey(m)
	}

	t.Run("average load per fleet and model", func(t *testing.T) {
		q := `avg by (fleet, model) (avg_over_time(diagnostics_current_load[2h]) / avg_over_time(diagnostics_load_capacity[2h]))`
		groups := map[string][]float64{}
		for _, tr := range d.trucks {
			l := window(tr.series["diagnostics_current_load"], tsbsAt, 2*time.Hour)
			c := window(tr.series["diagnostics_load_capacity"], tsbsAt, 2*time.Hour)
			if len(l) > 0 && len(c) > 0 {
				groups[byFleetModel(tr)] = append(groups[byFleetModel(tr)], mean(l)/mean(c))
			}
		}
		want := promVector{}
		for k, v := range groups {
			want[k] = mean(v)
		}
		require.Greater(t, len(want), 1)
		assertVector(t, q, want, s.instant(t, q))
	})

	t.Run("daily activity per fleet and model", func(t *testing.T) {
		q := `count_over_time((avg by (fleet, model) (avg_over_time(diagnostics_status[10m])) < 1)[1d:10m]) / 144`
		active := map[string]int{}
		for _, at := range subqueryTimes(tsbsAt, 24*time.Hour, 10*time.Minute) {
			groups := map[string][]float64{}
			for _, tr := range d.trucks {
				if v, ok := avg10m(tr, "diagnostics_status", at); ok {
					groups[byFleetModel(tr)] = append(groups[byFleetModel(tr)], v)
				}
			}
			for k, v := range groups {
				if mean(v) < 1 {
					active[k]++
				}
			}
		}
		want := promVector{}
		for k, n := range active {
			want[k] = float64(n) / 144
		}
		require.NotEmpty(t, want)
		assertVector(t, q, want, s.instant(t, q))
	})

	t.Run("the sample is what the README says", func(t *testing.T) {
		assert.Equal(t, 6513, d.lines)
		assert.Equal(t, 10, d.nameless)
		assert.True(t, bytes.HasPrefix(d.body, []byte("readings,name=truck_0,")))
	})
}
