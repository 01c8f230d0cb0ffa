package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fleetDashboard is the part of deploy/grafana/dashboards/fleet.json
// the test checks.
type fleetDashboard struct {
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
			Datasource struct{ UID string }
			Query      struct {
				Query string `json:"query"`
			} `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title      string `json:"title"`
		Datasource struct{ UID string }
		Targets    []struct {
			Expr       string `json:"expr"`
			Datasource struct{ UID string }
		} `json:"targets"`
	} `json:"panels"`
}

// grafanaVars stands in for the dashboard's variables when an
// expression is parsed or run.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "5m", "$__range", "1h",
	"$device", "d1|dev-00[0-4]", "$value", "temp")

// labelValuesQuery matches Grafana's label_values([selector,] label).
var labelValuesQuery = regexp.MustCompile(`^label_values\((?:(.+),\s*)?([A-Za-z_][A-Za-z0-9_]*)\)$`)

// TestGrafanaFleetProvisioning parses the provisioned data source and
// the fleet dashboard: the data source is telemetryd's query API, every
// panel and variable uses it, every PromQL expression parses with the
// Prometheus parser and runs against the real query API.
func TestGrafanaFleetProvisioning(t *testing.T) {
	inLane(t, lanes.general)
	ds := yamlFile[struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct {
			Name     string         `yaml:"name"`
			UID      string         `yaml:"uid"`
			Type     string         `yaml:"type"`
			Access   string         `yaml:"access"`
			URL      string         `yaml:"url"`
			JSONData map[string]any `yaml:"jsonData"`
		} `yaml:"datasources"`
	}](t, "grafana/provisioning/datasources/telemetryd.yaml")
	require.Equal(t, 1, ds.APIVersion)
	require.Len(t, ds.Datasources, 1)
	src := ds.Datasources[0]
	assert.Equal(t, "telemetryd", src.Name)
	assert.Equal(t, "telemetryd", src.UID)
	assert.Equal(t, "prometheus", src.Type, "Grafana's built-in Prometheus data source")
	assert.Equal(t, "proxy", src.Access)
	assert.Equal(t, "https://telemetryd:8080", src.URL, "the compose service and port of the HTTPS API")
	assert.Equal(t, "POST", src.JSONData["httpMethod"])

	var d fleetDashboard
	require.NoError(t, json.Unmarshal(readDeploy(t, "grafana/dashboards/fleet.json"), &d))
	assert.Equal(t, "telemetryd-fleet", d.UID)

	p := parser.NewParser(parser.Options{})
	fns := map[string]bool{}
	var exprs []string
	for _, panel := range d.Panels {
		assert.Equal(t, src.UID, panel.Datasource.UID, "panel %q", panel.Title)
		require.NotEmpty(t, panel.Targets, "panel %q", panel.Title)
		for _, tg := range panel.Targets {
			assert.Equal(t, src.UID, tg.Datasource.UID, "panel %q", panel.Title)
			expr, err := p.ParseExpr(grafanaVars.Replace(tg.Expr))
			require.NoError(t, err, "panel %q: %s", panel.Title, tg.Expr)
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				if c, ok := n.(*parser.Call); ok {
					fns[c.Func.Name] = true
				}
				return nil
			})
			exprs = append(exprs, grafanaVars.Replace(tg.Expr))
		}
	}
	assert.True(t, fns["avg_over_time"] && fns["max_over_time"], "panels use avg_over_time and max_over_time: %v", fns)

	vars := map[string]string{}
	for _, v := range d.Templating.List {
		assert.Equal(t, src.UID, v.Datasource.UID, "variable %s", v.Name)
		assert.Equal(t, v.Definition, v.Query.Query, "variable %s", v.Name)
		m := labelValuesQuery.FindStringSubmatch(v.Query.Query)
		require.NotNil(t, m, "variable %s: %q is not label_values(...)", v.Name, v.Query.Query)
		if m[1] != "" {
			_, err := p.ParseMetricSelector(grafanaVars.Replace(m[1]))
			require.NoError(t, err, "variable %s: %s", v.Name, m[1])
		}
		vars[v.Name] = v.Query.Query
	}
	assert.Equal(t, "label_values(device)", vars["device"], "the device picker")

	// Every expression runs on the real query API and finds data.
	f := newPromFixture(t)
	for _, e := range exprs {
		val, _, _, err := f.api.Query(context.Background(), e, f.now)
		require.NoError(t, err, e)
		vec, ok := val.(model.Vector)
		require.True(t, ok, "%s: %T", e, val)
		assert.NotEmpty(t, vec, "%s finds data", e)
	}
	names, _, _, err := f.api.LabelValues(context.Background(), "__name__", []string{`{device=~"d1|dev-00[0-4]"}`}, f.now.Add(-3600e9), f.now)
	require.NoError(t, err)
	assert.Contains(t, names, model.LabelValue("temp"), "the value variable offers temp")
}

// grafanaCall is one request Grafana's Prometheus data source sends.
type grafanaCall struct {
	why          string // what in Grafana sends it
	method, path string
	params       url.Values
	check        func(t *testing.T, data json.RawMessage) // the data's Prometheus shape
}

// TestGrafanaDataSourceCalls replays what Grafana's built-in Prometheus
// data source sends (provisioned with httpMethod POST, as in deploy/)
// and checks that each call answers 200 with status "success" and its
// data in Prometheus' shape. The calls are taken from Grafana's source:
//   - pkg/promlib/healthcheck.go: "Save & test" runs the instant query
//     1+1 (time range 1 s..4 s);
//   - pkg/promlib/heuristics.go: then GET api/v1/status/buildinfo
//     (Prometheus when data.features is empty);
//   - pkg/promlib/client/client.go: panel queries (query_range with
//     query, start, end, step in seconds; query with query, time;
//     query_exemplars), POST unless the path is in its GET-only list
//     (label values, metadata, rules, status/*);
//   - packages/grafana-prometheus/src/datasource.ts: loadRules (GET
//     api/v1/rules), areExemplarsAvailable (api/v1/query_exemplars with
//     query=test and start/end in milliseconds);
//   - packages/grafana-prometheus/src/language_provider.ts: the query
//     editor and metric browser: label/__name__/values, metadata,
//     labels with and without match[], label/<name>/values with
//     match[], series with match[] and limit;
//   - packages/grafana-prometheus/src/resource_clients.ts (newer
//     releases): LabelsApiClient (labels and label values with limit)
//     and SeriesApiClient (series with match[]={__name__!=""} or
//     {<label>!=""} and limit, for servers without label matchers).
func TestGrafanaDataSourceCalls(t *testing.T) {
	inLane(t, lanes.general)
	f := newPromFixture(t)
	now := f.now.Unix()
	sec := func(s int64) string { return strconv.FormatInt(s, 10) }
	rng := url.Values{"start": {sec(now - 3600)}, "end": {sec(now)}}
	with := func(v url.Values, kv ...string) url.Values {
		out := url.Values{}
		for k, vs := range v {
			out[k] = append([]string(nil), vs...)
		}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	strs := func(want ...string) func(*testing.T, json.RawMessage) {
		return func(t *testing.T, data json.RawMessage) {
			var got []string
			require.NoError(t, json.Unmarshal(data, &got), "a list of strings: %s", data)
			for _, w := range want {
				assert.Contains(t, got, w)
			}
		}
	}
	vector := func(t *testing.T, data json.RawMessage) {
		var q struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		}
		require.NoError(t, json.Unmarshal(data, &q))
		switch q.ResultType {
		case "scalar":
			var s model.Scalar
			require.NoError(t, json.Unmarshal(q.Result, &s))
			assert.Equal(t, model.SampleValue(2), s.Value, "1+1")
		case "vector":
			var v model.Vector
			require.NoError(t, json.Unmarshal(q.Result, &v))
			assert.NotEmpty(t, v)
		default:
			t.Fatalf("resultType %q", q.ResultType)
		}
	}
	emptyList := func(t *testing.T, data json.RawMessage) {
		var ex []v1.ExemplarQueryResult
		require.NoError(t, json.Unmarshal(data, &ex), "%s", data)
		assert.Empty(t, ex)
		assert.Equal(t, "[]", string(data))
	}
	calls := []grafanaCall{
		{"Save & test: health check", "POST", "/api/v1/query", url.Values{"query": {"1+1"}, "time": {"4"}}, vector},
		{"Save & test: heuristics", "GET", "/api/v1/status/buildinfo", nil, func(t *testing.T, data json.RawMessage) {
			var bi v1.BuildinfoResult
			require.NoError(t, json.Unmarshal(data, &bi))
			assert.NotEmpty(t, bi.Version)
			assert.Equal(t, runtime.Version(), bi.GoVersion)
			var raw map[string]any
			require.NoError(t, json.Unmarshal(data, &raw))
			assert.NotContains(t, raw, "features", "no features: Grafana takes the server for Prometheus, not Mimir")
			for _, k := range []string{"version", "revision", "branch", "buildUser", "buildDate", "goVersion"} {
				assert.Contains(t, raw, k)
			}
		}},
		{"data source init: loadRules", "GET", "/api/v1/rules", nil, func(t *testing.T, data json.RawMessage) {
			var r v1.RulesResult
			require.NoError(t, json.Unmarshal(data, &r))
			assert.JSONEq(t, `{"groups":[]}`, string(data))
		}},
		{"data source init: areExemplarsAvailable", "POST", "/api/v1/query_exemplars", url.Values{"query": {"test"},
			"start": {sec(f.now.Add(-30 * time.Minute).UnixMilli())}, "end": {sec(f.now.UnixMilli())}}, emptyList},
		{"editor: metric names", "GET", "/api/v1/label/__name__/values", rng, strs("temp", "hum", "ok", "cpu.usage_idle")},
		{"editor: metadata", "GET", "/api/v1/metadata", nil, func(t *testing.T, data json.RawMessage) {
			var md map[string][]v1.Metadata
			require.NoError(t, json.Unmarshal(data, &md))
			require.Contains(t, md, "temp")
			assert.Equal(t, v1.MetricTypeGauge, md["temp"][0].Type)
			assert.NotEmpty(t, md["temp"][0].Help)
			assert.NotContains(t, md, "state", "strings are not series")
		}},
		{"editor: label names", "POST", "/api/v1/labels", rng, strs("__name__", "device")},
		{"metric browser: labels of a metric", "POST", "/api/v1/labels", with(rng, "match[]", "temp"), strs("__name__", "device")},
		{"metric browser: values with match", "GET", "/api/v1/label/device/values", with(rng, "match[]", `temp{device=~"d1|dev-00[0-4]"}`),
			strs("d1", "dev-000", "dev-004")},
		{"metric browser: series", "POST", "/api/v1/series", with(rng, "match[]", `{__name__="temp"}`, "limit", "40000"),
			func(t *testing.T, data json.RawMessage) {
				var ss []model.LabelSet
				require.NoError(t, json.Unmarshal(data, &ss))
				assert.Len(t, ss, 101)
			}},
		{"LabelsApiClient: metric names", "GET", "/api/v1/label/__name__/values", with(rng, "limit", "40000"),
			strs("temp", "hum", "ok", "cpu.usage_idle")},
		{"LabelsApiClient: label keys", "POST", "/api/v1/labels", with(rng, "limit", "40000"), strs("__name__", "device")},
		{"SeriesApiClient: every series", "POST", "/api/v1/series", with(rng, "match[]", `{__name__!=""}`, "limit", "40000"),
			func(t *testing.T, data json.RawMessage) {
				var ss []model.LabelSet
				require.NoError(t, json.Unmarshal(data, &ss))
				assert.Len(t, ss, 205, "d1's four numeric values, 100 temperatures and the 101 devices' last-seen series")
			}},
		{"SeriesApiClient: values of a label", "POST", "/api/v1/series", with(rng, "match[]", `{device!=""}`, "limit", "2"),
			func(t *testing.T, data json.RawMessage) {
				var ss []model.LabelSet
				require.NoError(t, json.Unmarshal(data, &ss))
				assert.Len(t, ss, 2, "limit")
			}},
		{"panel: range query", "POST", "/api/v1/query_range", with(rng, "query", `avg_over_time(temp{device="d1"}[5m])`, "step", "15"),
			func(t *testing.T, data json.RawMessage) {
				var q struct {
					ResultType string       `json:"resultType"`
					Result     model.Matrix `json:"result"`
				}
				require.NoError(t, json.Unmarshal(data, &q))
				assert.Equal(t, "matrix", q.ResultType)
				require.Len(t, q.Result, 1)
				assert.Len(t, q.Result[0].Values, 241)
			}},
		{"panel: instant query", "POST", "/api/v1/query", url.Values{"query": {`temp{device="d1"}`}, "time": {sec(now)}}, vector},
		{"panel: exemplars", "POST", "/api/v1/query_exemplars", with(rng, "query", `temp{device="d1"}`), emptyList},
	}
	for _, c := range calls {
		t.Run(c.why, func(t *testing.T) {
			var req *http.Request
			var err error
			if c.method == http.MethodPost {
				req, err = http.NewRequest(c.method, f.env.base+c.path, strings.NewReader(c.params.Encode()))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			} else {
				u := f.env.base + c.path
				if len(c.params) > 0 {
					u += "?" + c.params.Encode()
				}
				req, err = http.NewRequest(c.method, u, nil)
				require.NoError(t, err)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s: %s", c.method, c.path, body)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var env struct {
				Status string          `json:"status"`
				Data   json.RawMessage `json:"data"`
			}
			require.NoError(t, json.Unmarshal(body, &env), "%s", body)
			require.Equal(t, "success", env.Status, "%s", body)
			c.check(t, env.Data)
		})
	}

	// The same answers through Prometheus' own Go client, which decodes
	// each shape strictly.
	ctx := context.Background()
	bi, err := f.api.Buildinfo(ctx)
	require.NoError(t, err)
	assert.Equal(t, runtime.Version(), bi.GoVersion)
	md, err := f.api.Metadata(ctx, "temp", "")
	require.NoError(t, err)
	assert.Equal(t, map[string][]v1.Metadata{"temp": {{Type: v1.MetricTypeGauge, Help: md["temp"][0].Help}}}, md)
	md, err = f.api.Metadata(ctx, "", "2")
	require.NoError(t, err)
	assert.Len(t, md, 2, "limit")
	rules, err := f.api.Rules(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, rules.Groups)
	ex, err := f.api.QueryExemplars(ctx, "temp", f.now.Add(-time.Hour), f.now)
	require.NoError(t, err)
	assert.Empty(t, ex)
	_, err = f.api.QueryExemplars(ctx, "temp{", f.now.Add(-time.Hour), f.now)
	require.ErrorContains(t, err, "bad_data", "an expression that does not parse")
}
