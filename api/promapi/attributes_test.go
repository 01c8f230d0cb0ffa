package promapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

var attrNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func attrs(kv ...string) buckets.Attributes {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	a, err := buckets.NewAttributes(m)
	if err != nil {
		panic(err)
	}
	return a
}

func load(at time.Time, v float64) buckets.Reading {
	return buckets.Reading{Ticks: buckets.MustTicks(at), Values: []buckets.Field{{Name: "load", Value: buckets.Float(v)}}}
}

// fleetSource holds three trucks of two fleets and a van without
// attributes, each with a reading a minute ago.
func fleetSource() *memSource {
	src := newMemSource()
	ago := attrNow.Add(-time.Minute)
	src.add("truck_1", attrs("fleet", "East", "model", "F-150"), load(ago, 10))
	src.add("truck_10", attrs("fleet", "East", "model", "F-250"), load(ago, 20))
	src.add("truck_2", attrs("fleet", "West", "route", "secret"), load(ago, 40))
	src.add("van_1", nil, load(ago, 1))
	return src
}

// promGet calls the API and decodes its data.
func promGet(t *testing.T, a *API, path string, data any) {
	t.Helper()
	rec := httptest.NewRecorder()
	a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var body struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.NoError(t, json.Unmarshal(body.Data, data), rec.Body.String())
}

type vectorSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// instant runs an instant query at ts and returns "labels=value" lines, sorted.
func instant(t *testing.T, a *API, query string, ts time.Time) []string {
	t.Helper()
	var data struct {
		Result []vectorSample `json:"result"`
	}
	promGet(t, a, "/api/v1/query?"+url.Values{"query": {query}, "time": {strconv.FormatInt(ts.Unix(), 10)}}.Encode(), &data)
	var out []string
	for _, s := range data.Result {
		out = append(out, labels.FromMap(s.Metric).String()+"="+s.Value[1].(string))
	}
	sort.Strings(out)
	return out
}

func TestAttributesAreLabels(t *testing.T) {
	src := fleetSource()
	a, err := New(Config{Source: src, Now: func() time.Time { return attrNow }})
	require.NoError(t, err)

	assert.Equal(t, []string{
		`{__name__="load", device="truck_1", fleet="East", model="F-150"}=10`,
		`{__name__="load", device="truck_10", fleet="East", model="F-250"}=20`,
		`{__name__="load", device="truck_2", fleet="West", route="secret"}=40`,
		`{__name__="load", device="van_1"}=1`,
	}, instant(t, a, "load", attrNow))
	assert.Equal(t, []string{`{fleet="East"}=15`, `{fleet="West"}=40`, `{}=1`}, instant(t, a, "avg by (fleet) (load)", attrNow))

	t.Run("attribute matchers select devices in the store", func(t *testing.T) {
		src.mu.Lock()
		src.listed = nil
		src.mu.Unlock()
		assert.Equal(t, []string{`{__name__="load", device="truck_1", fleet="East", model="F-150"}=10`,
			`{__name__="load", device="truck_10", fleet="East", model="F-250"}=20`},
			instant(t, a, `load{fleet="East"}`, attrNow))
		src.mu.Lock()
		defer src.mu.Unlock()
		require.NotEmpty(t, src.listed)
		for _, q := range src.listed {
			require.Len(t, q.Match, 1, "every device listing carries the matcher")
			assert.Equal(t, `fleet="East"`, q.Match[0].String())
		}
	})
	t.Run("a matcher the empty string satisfies keeps devices without the attribute", func(t *testing.T) {
		assert.Equal(t, []string{`{__name__="load", device="van_1"}=1`}, instant(t, a, `load{fleet=""}`, attrNow))
		assert.Len(t, instant(t, a, `load{job!="x"}`, attrNow), 4, "a label that cannot be an attribute is absent everywhere")
		assert.Empty(t, instant(t, a, `load{__job="x"}`, attrNow))
	})
	t.Run("labels, values and series", func(t *testing.T) {
		var names []string
		promGet(t, a, "/api/v1/labels", &names)
		assert.Equal(t, []string{"__name__", "device", "fleet", "model", "route"}, names)
		var vals []string
		promGet(t, a, "/api/v1/label/fleet/values", &vals)
		assert.Equal(t, []string{"East", "West"}, vals)
		promGet(t, a, "/api/v1/label/model/values?"+url.Values{"match[]": {`{fleet="East",device=~"truck_1.*"}`}}.Encode(), &vals)
		assert.Equal(t, []string{"F-150", "F-250"}, vals)
		promGet(t, a, "/api/v1/label/fleet/values?"+url.Values{"match[]": {`load{device="truck_2"}`}}.Encode(), &vals)
		assert.Equal(t, []string{"West"}, vals, "with a metric name, from the series")
		var series []map[string]string
		promGet(t, a, "/api/v1/series?"+url.Values{"match[]": {`load{model=~"F-.*"}`}}.Encode(), &series)
		assert.Equal(t, []map[string]string{
			{"__name__": "load", "device": "truck_1", "fleet": "East", "model": "F-150"},
			{"__name__": "load", "device": "truck_10", "fleet": "East", "model": "F-250"},
		}, series)
	})
}

func TestAttributesOfHiddenDevicesStayHidden(t *testing.T) {
	src := fleetSource()
	a, err := New(Config{Source: src, Now: func() time.Time { return attrNow },
		Visible: func(context.Context) func(buckets.DeviceID) bool {
			return func(d buckets.DeviceID) bool { return strings.HasPrefix(string(d), "truck_1") }
		}})
	require.NoError(t, err)
	var names, vals []string
	promGet(t, a, "/api/v1/labels", &names)
	assert.Equal(t, []string{"__name__", "device", "fleet", "model"}, names, "truck_2's route is not learned")
	promGet(t, a, "/api/v1/label/fleet/values", &vals)
	assert.Equal(t, []string{"East"}, vals, "truck_2's fleet is not learned")
	promGet(t, a, "/api/v1/label/route/values", &vals)
	assert.Empty(t, vals)
	promGet(t, a, "/api/v1/label/fleet/values?"+url.Values{"match[]": {`load`}}.Encode(), &vals)
	assert.Equal(t, []string{"East"}, vals)
	assert.Empty(t, instant(t, a, `load{fleet="West"}`, attrNow))
	assert.Empty(t, instant(t, a, `load{route="secret"}`, attrNow))
	assert.Equal(t, []string{`{fleet="East"}=15`}, instant(t, a, "avg by (fleet) (load)", attrNow))
}

// silentSource has devices last heard from at various times before
// attrNow, each reading once every 5 minutes until then.
func silentSource() *memSource {
	src := newMemSource()
	for _, d := range []struct {
		dev   buckets.DeviceID
		fleet string
		ago   time.Duration
	}{
		{"live", "East", time.Minute},
		{"edge", "East", 10 * time.Minute}, // exactly 600 s: not more
		{"quiet", "East", 10*time.Minute + time.Second},
		{"gone", "West", 3 * time.Hour},
		{"expired", "West", 30 * 24 * time.Hour},
	} {
		last := attrNow.Add(-d.ago)
		var rs []buckets.Reading
		for at := last.Add(-time.Hour); !at.After(last); at = at.Add(5 * time.Minute) {
			rs = append(rs, load(at, 1))
		}
		src.add(d.dev, attrs("fleet", d.fleet), rs...)
	}
	src.add("never", attrs("fleet", "East")) // known by its attributes only
	return src
}

func TestLastSeenSeries(t *testing.T) {
	src := silentSource()
	a, err := New(Config{Source: src, Now: func() time.Time { return attrNow }, Retention: 7 * 24 * time.Hour})
	require.NoError(t, err)
	sec := func(ago time.Duration) string {
		return strconv.FormatFloat(float64(attrNow.Add(-ago).UnixMilli())/1000, 'f', -1, 64)
	}

	before := src.rangeCalls()
	assert.Equal(t, []string{
		`{__name__="` + LastSeenName + `", device="edge", fleet="East"}=` + sec(10*time.Minute),
		`{__name__="` + LastSeenName + `", device="gone", fleet="West"}=` + sec(3*time.Hour),
		`{__name__="` + LastSeenName + `", device="live", fleet="East"}=` + sec(time.Minute),
		`{__name__="` + LastSeenName + `", device="quiet", fleet="East"}=` + sec(10*time.Minute+time.Second),
	}, instant(t, a, LastSeenName, attrNow), "devices expired by the retention and devices that never sent a reading have none")
	assert.Equal(t, before, src.rangeCalls(), "at or after the last reading the index answers: no reads")

	assert.Equal(t, []string{`{device="gone", fleet="West"}=10800`, `{device="quiet", fleet="East"}=601`},
		instant(t, a, "time() - "+LastSeenName+" > 600", attrNow))
	assert.Equal(t, []string{`{device="quiet", fleet="East"}=601`},
		instant(t, a, "time() - "+LastSeenName+`{fleet="East"} > 600`, attrNow))

	t.Run("before the last reading, the newest reading at or before", func(t *testing.T) {
		// 12 minutes earlier: live's last reading before then was 15
		// minutes before now (one every 5 minutes until 1 minute ago).
		at := attrNow.Add(-12 * time.Minute)
		got := instant(t, a, LastSeenName+`{device="live"}`, at)
		assert.Equal(t, []string{`{__name__="` + LastSeenName + `", device="live", fleet="East"}=` + sec(16*time.Minute)}, got)
		got = instant(t, a, LastSeenName+`{device="gone"}`, at)
		assert.Equal(t, []string{`{__name__="` + LastSeenName + `", device="gone", fleet="West"}=` + sec(3*time.Hour)}, got)
	})
	t.Run("a range query: every step has its own value", func(t *testing.T) {
		start, end := attrNow.Add(-30*time.Minute), attrNow
		var data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		}
		promGet(t, a, "/api/v1/query_range?"+url.Values{"query": {LastSeenName + `{device="live"}`},
			"start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)}, "step": {"60"}}.Encode(), &data)
		require.Len(t, data.Result, 1)
		require.Len(t, data.Result[0].Values, 31)
		for i, v := range data.Result[0].Values {
			ts := start.Add(time.Duration(i) * time.Minute)
			// live read at now-1m-5k minutes: the newest at or before ts.
			lastReading := attrNow.Add(-time.Minute)
			for lastReading.After(ts) {
				lastReading = lastReading.Add(-5 * time.Minute)
			}
			want := strconv.FormatFloat(float64(lastReading.UnixMilli())/1000, 'f', -1, 64)
			assert.Equal(t, want, v[1], "step %s", ts)
		}
	})
}

// TestSilenceAlertRule evaluates the alert rule as Prometheus' ruler
// does (rules.EngineQueryFunc: an instant query of the rule's
// expression at the evaluation time, on the engine and storage the API
// uses); with no hold time every sample of the answer is a firing
// alert. It fires for exactly the silent devices, at each evaluation.
func TestSilenceAlertRule(t *testing.T) {
	src := silentSource()
	a, err := New(Config{Source: src, Now: func() time.Time { return attrNow }, Retention: 7 * 24 * time.Hour})
	require.NoError(t, err)
	rule := "time() - " + LastSeenName + " > 600"
	eval := func(at time.Time) []string {
		q, err := a.engine.NewInstantQuery(context.Background(), a.q, nil, rule, at)
		require.NoError(t, err)
		defer q.Close()
		res := q.Exec(context.Background())
		require.NoError(t, res.Err)
		vec, err := res.Vector()
		require.NoError(t, err)
		var firing []string
		for _, s := range vec {
			firing = append(firing, s.Metric.Get("device")+"/"+s.Metric.Get("fleet"))
		}
		slices.Sort(firing)
		return firing
	}
	assert.Equal(t, []string{"gone/West", "quiet/East"}, eval(attrNow))
	assert.Equal(t, []string{"edge/East", "gone/West", "quiet/East"}, eval(attrNow.Add(time.Second)), "a second later edge is silent too")
	assert.Equal(t, []string{"gone/West"}, eval(attrNow.Add(-time.Minute)), "a minute earlier quiet was not")
	assert.Empty(t, eval(attrNow.Add(-3*time.Hour)), "three hours earlier every device was sending")
}
