package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

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
