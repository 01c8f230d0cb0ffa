package promapi

import (
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
)

// The endpoints below are the rest of what Grafana's Prometheus data
// source calls besides queries, series and labels: "Save & test" asks
// for the build info, the query editor and metric browser for metric
// metadata, and the data source probes the exemplar and rules APIs.
// Each answers in Prometheus' shape, so none of them shows an error in
// Grafana.

// registerGrafana adds the build info, metadata, exemplar and rules
// endpoints to the API's routes.
func (a *API) registerGrafana() {
	a.mux.HandleFunc("GET /api/v1/status/buildinfo", a.handleBuildInfo)
	a.mux.HandleFunc("GET /api/v1/metadata", a.handleMetadata)
	a.mux.HandleFunc("GET /api/v1/query_exemplars", a.handleExemplars)
	a.mux.HandleFunc("POST /api/v1/query_exemplars", a.handleExemplars)
	a.mux.HandleFunc("GET /api/v1/rules", a.handleRules)
}

// GrafanaPaths are the paths registerGrafana serves, for a router in
// front of the API.
var GrafanaPaths = []string{"/api/v1/status/buildinfo", "/api/v1/metadata", "/api/v1/query_exemplars", "/api/v1/rules"}

// BuildInfo is the data of /api/v1/status/buildinfo, with Prometheus'
// field names. Features stays empty: Grafana takes a server with
// features for Mimir and then expects a ruler API.
type BuildInfo struct {
	Version   string `json:"version"`
	Revision  string `json:"revision"`
	Branch    string `json:"branch"`
	BuildUser string `json:"buildUser"`
	BuildDate string `json:"buildDate"`
	GoVersion string `json:"goVersion"`
}

// buildInfo reads the binary's module version and VCS stamp once: what
// the build info reports when Config.Build names no version.
var buildInfo = sync.OnceValue(func() BuildInfo {
	bi := BuildInfo{Version: "unknown", GoVersion: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return bi
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		bi.Version = strings.TrimPrefix(v, "v")
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			bi.Revision = s.Value
		case "vcs.time":
			bi.BuildDate = s.Value
		}
	}
	return bi
})

// handleBuildInfo serves /api/v1/status/buildinfo: telemetryd's version
// and build in Prometheus' shape.
func (a *API) handleBuildInfo(w http.ResponseWriter, _ *http.Request) {
	writeData(w, a.build, nil)
}

// buildOf is what the build info of cfg reports.
func buildOf(cfg Config) BuildInfo {
	b := cfg.Build
	if b.Version == "" {
		return buildInfo()
	}
	if b.GoVersion == "" {
		b.GoVersion = runtime.Version()
	}
	return b
}

// metricMetadata is one entry of /api/v1/metadata.
type metricMetadata struct {
	Type string `json:"type"`
	Help string `json:"help"`
	Unit string `json:"unit"`
}

// helpOf describes a metric name in /api/v1/metadata.
func helpOf(name string) string {
	if name == "telemetry_device_last_seen_timestamp_seconds" {
		return "Time of the device's last reading at or before the evaluation time, in Unix seconds."
	}
	return "Value " + name + " of the devices' readings (bool as 0/1), one series per device."
}

// handleMetadata serves /api/v1/metadata: every metric name a caller
// can see, each a gauge (a reading value is a sample, not a counter).
// metric picks one name; limit bounds the names (0 or less: no limit),
// as in Prometheus.
func (a *API) handleMetadata(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		writeError(w, badData("", "cannot parse the form: %v", err))
		return
	}
	limit, aerr := intParam(r, "limit")
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	// Each name has one entry, so limit_per_metric is checked and met.
	if _, aerr := intParam(r, "limit_per_metric"); aerr != nil {
		writeError(w, aerr)
		return
	}
	qr := &querier{q: a.q, mint: minTime.UnixMilli(), maxt: maxTime.UnixMilli()}
	names, _, err := qr.LabelValues(r.Context(), "__name__", nil)
	if err != nil {
		writeError(w, a.execError(r, err))
		return
	}
	out := map[string][]metricMetadata{}
	metric := r.Form.Get("metric")
	for _, n := range names {
		if metric != "" && n != metric {
			continue
		}
		if limit > 0 && len(out) == limit {
			break
		}
		out[n] = []metricMetadata{{Type: "gauge", Help: helpOf(n)}}
	}
	writeData(w, out, nil)
}

// intParam parses an optional integer parameter; -1 when absent.
func intParam(r *http.Request, name string) (int, *apiError) {
	s := r.Form.Get(name)
	if s == "" {
		return -1, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, badData(name, "cannot parse %q to an integer", s)
	}
	return n, nil
}

// handleExemplars serves /api/v1/query_exemplars: readings carry no
// exemplars, so a valid query answers an empty list (what Prometheus
// answers for series without any) and an invalid one bad_data.
func (a *API) handleExemplars(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		writeError(w, badData("", "cannot parse the form: %v", err))
		return
	}
	if _, _, aerr := parseTimeRange(r, minTime, maxTime); aerr != nil {
		writeError(w, aerr)
		return
	}
	qs := r.Form.Get("query")
	if qs == "" {
		writeError(w, badData("query", "missing; give a PromQL expression"))
		return
	}
	if _, err := a.parser.ParseExpr(qs); err != nil {
		writeError(w, badData("query", "%v", err))
		return
	}
	writeData(w, []struct{}{}, nil)
}

// handleRules serves /api/v1/rules: telemetryd evaluates no recording
// or alerting rules (Grafana or Prometheus' ruler does), so the list of
// groups is empty.
func (a *API) handleRules(w http.ResponseWriter, _ *http.Request) {
	writeData(w, map[string][]struct{}{"groups": {}}, nil)
}
