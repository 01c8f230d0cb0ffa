package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/otlptranslator"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"gopkg.in/yaml.v3"
)

// The tests in this file validate deploy/: every YAML and JSON file
// parses, and the files agree with each other and with the service
// (flags, endpoints, metric names). Run them alone with
// go test ./cmd/telemetryd/ -run Deploy.

// deployDir is deploy/ relative to this package (go test runs in the
// package directory).
var deployDir = filepath.Join("..", "..", "deploy")

// serviceFlags are telemetryd's flags (cmd/telemetryd/CONFIGURATION.md) with their defaults.
var serviceFlags = map[string]string{
	"data-dir": "./data", "http-addr": "127.0.0.1:8080", "nats-url": "", "nats-listen": "127.0.0.1:4222",
	"subject-prefix": "telemetry", "retention": "720h", "retention-interval": "1h",
	"retention-max-bytes": "0", "max-future-skew": "5m", "sync-writes": "true",
	"log-level": "info", "log-format": "text", "pprof-addr": "",
	"shutdown-timeout": "10s", "hot-days": "2", "max-open-tables": "8",
	"auth-file": "", "insecure": "false", "tls-cert": "", "tls-key": "", "http-max-conns": "1024",
	"http-max-conns-per-client": "64", "http-rate": "1000", "http-burst": "2000", "cursor-key": "",
	"nats-creds": "", "nats-user": "", "nats-password": "",
	"partitions": "0", "copies": "2", "node-name": "", "advertise-url": "", "lease-ttl": "10s",
	"cluster-token": "", "stream-replicas": "3",
}

// simFlags are telemetry-sim's flags.
var simFlags = []string{
	"nats-url", "subject-prefix", "devices", "device-prefix", "rate", "duration", "count", "batch",
	"format", "ts-format", "values", "max-pending", "msg-id", "seq-start", "trace", "seed", "progress", "log-format",
}

func envVar(prefix, flag string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// checkEnvKeys fails for every TELEMETRY_* key that names no flag (of
// the service's FlagSet, or of telemetry-sim), so a
// misspelt variable cannot be silently ignored.
func checkEnvKeys(t *testing.T, where string, keys []string) {
	t.Helper()
	known := map[string]bool{}
	c := DefaultConfig()
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	c.bind(fs)
	fs.VisitAll(func(f *flag.Flag) { known[envName(f.Name)] = true })
	for _, f := range simFlags {
		known[envVar("TELEMETRY_SIM_", f)] = true
	}
	for _, k := range keys {
		if strings.HasPrefix(k, "TELEMETRY_") {
			assert.True(t, known[k], "%s: %s is not a telemetryd or telemetry-sim setting", where, k)
		}
	}
}

func readDeploy(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, rel))
	require.NoError(t, err)
	return b
}

// yamlDocs decodes every document of a YAML file under deploy/ into a
// new T each.
func yamlDocs[T any](t *testing.T, rel string) []T {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(readDeploy(t, rel)))
	var docs []T
	for {
		var v T
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return docs
		}
		require.NoError(t, err, "%s document %d", rel, len(docs)+1)
		docs = append(docs, v)
	}
}

func yamlFile[T any](t *testing.T, rel string) T {
	t.Helper()
	docs := yamlDocs[T](t, rel)
	require.Len(t, docs, 1, "%s: want one YAML document", rel)
	return docs[0]
}

func TestDeployFilesParse(t *testing.T) {
	inLane(t, lanes.general)
	var yamls, jsons []string
	err := filepath.WalkDir(deployDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(deployDir, path)
		switch filepath.Ext(path) {
		case ".yaml", ".yml":
			yamls = append(yamls, rel)
		case ".json":
			jsons = append(jsons, rel)
		}
		return nil
	})
	require.NoError(t, err)
	for _, rel := range yamls {
		docs := yamlDocs[map[string]any](t, rel)
		assert.NotEmpty(t, docs, "%s has no YAML document", rel)
		for i, d := range docs {
			assert.NotEmpty(t, d, "%s document %d is empty", rel, i+1)
		}
	}
	for _, rel := range jsons {
		var v map[string]any
		assert.NoError(t, json.Unmarshal(readDeploy(t, rel), &v), rel)
	}
	for _, want := range []string{"compose.yaml", "otel-collector.yaml", "prometheus.yml",
		"k8s/statefulset.yaml", "grafana/provisioning/datasources/prometheus.yaml"} {
		assert.Contains(t, yamls, filepath.FromSlash(want))
	}
	assert.Contains(t, jsons, filepath.FromSlash("grafana/dashboards/telemetry.json"))
}

// composeFile is the part of compose.yaml the tests check.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       *composeBuild     `yaml:"build"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	DependsOn map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

// mounts maps each bind-mount target of s to its source path relative
// to deploy/, and each named volume target to "volume:<name>".
func (s composeService) mounts(t *testing.T, declared map[string]any) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		require.GreaterOrEqual(t, len(parts), 2, "volume %q", v)
		src, dst := parts[0], parts[1]
		if clean := filepath.ToSlash(filepath.Clean(src)); strings.HasPrefix(clean, "secrets") {
			// Made by deploy/secrets.sh, never committed.
			script := string(readDeploy(t, "secrets.sh"))
			assert.True(t, clean == "secrets" || strings.Contains(script, `$out/`+strings.TrimPrefix(clean, "secrets/")),
				"bind mount source %s is not made by secrets.sh", src)
			out[dst] = clean
			continue
		}
		if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
			_, err := os.Stat(filepath.Join(deployDir, src))
			assert.NoError(t, err, "bind mount source %s", src)
			out[dst] = filepath.ToSlash(filepath.Clean(src))
			continue
		}
		assert.Contains(t, declared, src, "named volume %s is not declared", src)
		out[dst] = "volume:" + src
	}
	return out
}

func TestDeployCompose(t *testing.T) {
	inLane(t, lanes.general)
	c := yamlFile[composeFile](t, "compose.yaml")
	for _, name := range []string{"telemetryd", "simulator", "otel-collector", "prometheus", "grafana"} {
		require.Contains(t, c.Services, name)
	}
	for name, s := range c.Services {
		assert.True(t, s.Image != "" || s.Build != nil, "%s has neither image nor build", name)
		if s.Build != nil {
			ctx := filepath.Join(deployDir, s.Build.Context)
			_, err := os.Stat(filepath.Join(ctx, s.Build.Dockerfile))
			assert.NoError(t, err, "%s: dockerfile %s in context %s", name, s.Build.Dockerfile, s.Build.Context)
			_, err = os.Stat(filepath.Join(ctx, "go.mod"))
			assert.NoError(t, err, "%s: build context %s is not the repository root", name, s.Build.Context)
		}
		for dep := range s.DependsOn {
			assert.Contains(t, c.Services, dep, "%s depends on a service that does not exist", name)
		}
		s.mounts(t, c.Volumes)
		checkEnvKeys(t, "compose "+name, slices.Collect(maps.Keys(s.Environment)))
	}

	svc := c.Services["telemetryd"]
	require.NotNil(t, svc.Healthcheck)
	assert.Regexp(t, `https://127\.0\.0\.1:8080/(healthz|readyz)$`, strings.Join(svc.Healthcheck.Test, " "))
	assert.Equal(t, "secrets", svc.mounts(t, c.Volumes)["/etc/telemetryd"], "credentials and certificate")
	assert.Equal(t, "volume:telemetry-data", svc.mounts(t, c.Volumes)["/data"])

	sim := c.Services["simulator"]
	assert.Equal(t, []string{"telemetry-sim"}, sim.Entrypoint)
	assert.Equal(t, svc.Image, sim.Image, "the simulator runs from the service image")
	assert.Regexp(t, `^tls://simulator:\$\{TELEMETRY_SIM_SECRET[^}]*\}@telemetryd:4222$`, sim.Environment["TELEMETRY_SIM_NATS_URL"],
		"the simulator logs in over TLS")
	assert.Equal(t, "/etc/telemetryd/ca.crt", sim.Environment["SSL_CERT_FILE"])
	assert.Equal(t, "service_healthy", sim.DependsOn["telemetryd"].Condition)

	col := c.Services["otel-collector"]
	require.Len(t, col.Command, 1)
	cfgPath := strings.TrimPrefix(col.Command[0], "--config=")
	assert.Equal(t, "otel-collector.yaml", col.mounts(t, c.Volumes)[cfgPath])
	assert.Equal(t, "http://otel-collector:4318", svc.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"])

	prom := c.Services["prometheus"]
	assert.Contains(t, prom.Command, "--config.file=/etc/prometheus/prometheus.yml")
	assert.Equal(t, "prometheus.yml", prom.mounts(t, c.Volumes)["/etc/prometheus/prometheus.yml"])

	graf := c.Services["grafana"].mounts(t, c.Volumes)
	assert.Equal(t, "grafana/provisioning", graf["/etc/grafana/provisioning"])
	provider := yamlFile[grafanaProviders](t, "grafana/provisioning/dashboards/telemetry.yaml")
	require.Len(t, provider.Providers, 1)
	assert.Equal(t, "grafana/dashboards", graf[provider.Providers[0].Options.Path], "dashboard provider path is not the mounted folder")
}

// collectorConfig is the part of otel-collector.yaml the tests check.
type collectorConfig struct {
	Receivers  map[string]map[string]any `yaml:"receivers"`
	Processors map[string]any            `yaml:"processors"`
	Exporters  map[string]map[string]any `yaml:"exporters"`
	Extensions map[string]any            `yaml:"extensions"`
	Service    struct {
		Extensions []string `yaml:"extensions"`
		Pipelines  map[string]struct {
			Receivers  []string `yaml:"receivers"`
			Processors []string `yaml:"processors"`
			Exporters  []string `yaml:"exporters"`
		} `yaml:"pipelines"`
	} `yaml:"service"`
}

func TestDeployOtelCollector(t *testing.T) {
	inLane(t, lanes.general)
	c := yamlFile[collectorConfig](t, "otel-collector.yaml")
	require.Contains(t, c.Service.Pipelines, "traces")
	require.Contains(t, c.Service.Pipelines, "metrics")
	for name, p := range c.Service.Pipelines {
		assert.NotEmpty(t, p.Receivers, "pipeline %s", name)
		assert.NotEmpty(t, p.Exporters, "pipeline %s", name)
		for _, r := range p.Receivers {
			assert.Contains(t, c.Receivers, r, "pipeline %s: receiver %s is not declared", name, r)
		}
		for _, pr := range p.Processors {
			assert.Contains(t, c.Processors, pr, "pipeline %s: processor %s is not declared", name, pr)
		}
		for _, e := range p.Exporters {
			assert.Contains(t, c.Exporters, e, "pipeline %s: exporter %s is not declared", name, e)
		}
	}
	for _, e := range c.Service.Extensions {
		assert.Contains(t, c.Extensions, e, "extension %s is not declared", e)
	}
	protocols, _ := c.Receivers["otlp"]["protocols"].(map[string]any)
	require.NotNil(t, protocols, "otlp receiver protocols")
	for proto, port := range map[string]string{"grpc": "4317", "http": "4318"} {
		p, _ := protocols[proto].(map[string]any)
		require.NotNil(t, p, "otlp %s", proto)
		assert.Equal(t, "0.0.0.0:"+port, p["endpoint"], "otlp %s must listen beyond the container's loopback", proto)
	}
	assert.Contains(t, c.Service.Pipelines["metrics"].Exporters, "prometheus")
	assert.Equal(t, "0.0.0.0:8889", c.Exporters["prometheus"]["endpoint"])
}

type promConfig struct {
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		MetricsPath   string `yaml:"metrics_path"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

func TestDeployPrometheus(t *testing.T) {
	inLane(t, lanes.general)
	cfg := yamlFile[promConfig](t, "prometheus.yml")
	targets := map[string]string{}
	for _, sc := range cfg.ScrapeConfigs {
		path := cmp.Or(sc.MetricsPath, "/metrics")
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				targets[tg] = path
			}
		}
	}
	assert.Equal(t, "/metrics", targets["telemetryd:8080"], "telemetryd's /metrics is not scraped")
	assert.Contains(t, targets, "otel-collector:8889")
}

// serviceMetrics are the metrics listed in cmd/telemetryd/OPERATIONS.md as the packages declare
// them (name, unit, instrument) and the Prometheus names they get on
// /metrics. TestDeployMetricNames proves the Prometheus column with the
// real exporter; the dashboard may use only these names.
var serviceMetrics = []struct{ name, unit, kind, prom string }{
	{"telemetry.ingest.readings", "{reading}", "counter", "telemetry_ingest_readings_total"},
	{"telemetry.ingest.messages", "{message}", "counter", "telemetry_ingest_messages_total"},
	{"telemetry.ingest.batch.size", "{reading}", "histogram", "telemetry_ingest_batch_size"},
	{"telemetry.ingest.lag", "s", "histogram", "telemetry_ingest_lag_seconds"},
	{"telemetry.ingest.redeliveries", "{message}", "counter", "telemetry_ingest_redeliveries_total"},
	{"telemetry.store.commit.duration", "s", "histogram", "telemetry_store_commit_duration_seconds"},
	{"telemetry.store.table_errors", "{error}", "counter", "telemetry_store_table_errors_total"},
	{"telemetry.store.tables", "{table}", "gauge", "telemetry_store_tables"},
	{"telemetry.store.open_tables", "{table}", "gauge", "telemetry_store_open_tables"},
	{"telemetry.store.bytes", "By", "gauge", "telemetry_store_bytes"},
	{"telemetry.retention.tables_dropped", "{table}", "counter", "telemetry_retention_tables_dropped_total"},
	{"telemetry.retention.bytes_freed", "By", "counter", "telemetry_retention_bytes_freed_total"},
	{"telemetry.retention.run.duration", "s", "histogram", "telemetry_retention_run_duration_seconds"},
	{"telemetry.retention.runs", "{run}", "counter", "telemetry_retention_runs_total"},
	{"http.server.request.duration", "s", "histogram", "http_server_request_duration_seconds"},
}

// metricLabels are the attributes the service puts on those metrics, as
// Prometheus labels, plus le of histogram buckets.
var metricLabels = []string{"outcome", "code", "reason", "dry_run", "http_route", "http_request_method",
	"http_response_status_code", "le", "job", "instance"}

// promQLNames is every series name PromQL may use for serviceMetrics.
func promQLNames() map[string]bool {
	names := map[string]bool{}
	for _, m := range serviceMetrics {
		if m.kind == "histogram" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[m.prom+suffix] = true
			}
			continue
		}
		names[m.prom] = true
	}
	return names
}

// The exporter setup mirrors the service's: the OpenTelemetry
// Prometheus exporter with underscore escaping and suffixes.
func TestDeployMetricNames(t *testing.T) {
	inLane(t, lanes.general)
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m := mp.Meter("deploy-test")
	ctx := context.Background()
	for _, sm := range serviceMetrics {
		switch sm.kind {
		case "counter":
			c, err := m.Int64Counter(sm.name, metric.WithUnit(sm.unit))
			require.NoError(t, err)
			c.Add(ctx, 1)
		case "histogram":
			h, err := m.Float64Histogram(sm.name, metric.WithUnit(sm.unit))
			require.NoError(t, err)
			h.Record(ctx, 0.5)
		case "gauge":
			g, err := m.Int64Gauge(sm.name, metric.WithUnit(sm.unit))
			require.NoError(t, err)
			g.Record(ctx, 3)
		}
	}
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]string{}
	for _, f := range families {
		got[f.GetName()] = strings.ToLower(f.GetType().String())
	}
	for _, sm := range serviceMetrics {
		assert.Equal(t, sm.kind, got[sm.prom], "%s (%s) is not exported as %s", sm.name, sm.unit, sm.prom)
	}
}

type grafanaProviders struct {
	Providers []struct {
		Name    string `yaml:"name"`
		Type    string `yaml:"type"`
		Options struct {
			Path string `yaml:"path"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Panels        []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		Targets []struct {
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
	} `json:"panels"`
}

var (
	promStrings   = regexp.MustCompile(`"[^"]*"`)
	promMatchers  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promGrouping  = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	promIdent     = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*\s*\(?`)
	promKeywords  = map[string]bool{"or": true, "and": true, "unless": true, "offset": true, "bool": true}
	promLabelName = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
)

// parsePromQL returns the metric names and the grouping labels of expr.
func parsePromQL(expr string) (metrics, labels []string) {
	e := promStrings.ReplaceAllString(expr, `""`)
	for _, g := range promGrouping.FindAllStringSubmatch(e, -1) {
		labels = append(labels, promLabelName.FindAllString(g[1], -1)...)
	}
	e = promGrouping.ReplaceAllString(promMatchers.ReplaceAllString(e, ""), "")
	for _, id := range promIdent.FindAllString(e, -1) {
		if strings.HasSuffix(id, "(") || promKeywords[strings.TrimSpace(id)] {
			continue // a function call or an operator
		}
		metrics = append(metrics, strings.TrimSpace(id))
	}
	return metrics, labels
}

func TestDeployGrafanaDashboard(t *testing.T) {
	inLane(t, lanes.general)
	ds := yamlFile[struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}](t, "grafana/provisioning/datasources/prometheus.yaml")
	require.Len(t, ds.Datasources, 1)
	assert.Equal(t, "prometheus", ds.Datasources[0].Type)
	assert.Equal(t, "http://prometheus:9090", ds.Datasources[0].URL)

	var d dashboard
	require.NoError(t, json.Unmarshal(readDeploy(t, "grafana/dashboards/telemetry.json"), &d))
	assert.NotEmpty(t, d.UID)
	assert.True(t, d.SchemaVersion >= 36 && d.SchemaVersion <= 41, "schemaVersion %d", d.SchemaVersion)
	known, used, ids := promQLNames(), map[string]bool{}, map[int]bool{}
	for _, p := range d.Panels {
		assert.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		assert.Equal(t, ds.Datasources[0].UID, p.Datasource.UID, "panel %q datasource", p.Title)
		assert.True(t, p.GridPos.W > 0 && p.GridPos.H > 0 && p.GridPos.X+p.GridPos.W <= 24, "panel %q gridPos %+v", p.Title, p.GridPos)
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			metrics, labels := parsePromQL(tg.Expr)
			assert.NotEmpty(t, metrics, "panel %q: no metric in %s", p.Title, tg.Expr)
			for _, m := range metrics {
				assert.True(t, known[m], "panel %q: %s is not a metric the service exports (%s)", p.Title, m, tg.Expr)
				used[m] = true
			}
			for _, l := range labels {
				assert.Contains(t, metricLabels, l, "panel %q groups by unknown label %s", p.Title, l)
			}
		}
	}
	for _, want := range []string{"telemetry_ingest_readings_total", "telemetry_ingest_lag_seconds_bucket",
		"http_server_request_duration_seconds_bucket", "telemetry_store_tables", "telemetry_store_bytes",
		"telemetry_ingest_redeliveries_total"} {
		assert.True(t, used[want], "no panel shows %s", want)
	}
}

func TestDeployParsePromQL(t *testing.T) {
	inLane(t, lanes.general)
	m, l := parsePromQL(`histogram_quantile(0.99, sum by (le, http_route) (rate(http_server_request_duration_seconds_bucket{job="x"}[5m]))) or vector(0)`)
	assert.Equal(t, []string{"http_server_request_duration_seconds_bucket"}, m)
	assert.Equal(t, []string{"le", "http_route"}, l)
	m, _ = parsePromQL(`sum(rate(a_total[1m])) / sum(rate(b_count[1m]))`)
	assert.Equal(t, []string{"a_total", "b_count"}, m)
}

// k8sObject is the part of a Kubernetes manifest the tests check; it
// covers the kinds in deploy/k8s.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Resources  []string          `yaml:"resources"` // Kustomization
	Spec       struct {
		ServiceName string         `yaml:"serviceName"`
		Replicas    *int           `yaml:"replicas"`
		Selector    yaml.Node      `yaml:"selector"` // Service: labels; StatefulSet: matchLabels
		Ports       []k8sPort      `yaml:"ports"`
		Template    k8sPodTemplate `yaml:"template"`
		Claims      []k8sObject    `yaml:"volumeClaimTemplates"`
		JobTemplate struct {
			Spec struct{ Template k8sPodTemplate }
		} `yaml:"jobTemplate"`
	} `yaml:"spec"`
}

type k8sPort struct {
	Name          string `yaml:"name"`
	Port          int    `yaml:"port"`
	ContainerPort int    `yaml:"containerPort"`
	TargetPort    string `yaml:"targetPort"`
}

type k8sPodTemplate struct {
	Metadata struct {
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec struct {
		Containers []k8sContainer `yaml:"containers"`
	} `yaml:"spec"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path   string `yaml:"path"`
		Port   string `yaml:"port"`
		Scheme string `yaml:"scheme"`
	} `yaml:"httpGet"`
}

type k8sContainer struct {
	Name    string    `yaml:"name"`
	Image   string    `yaml:"image"`
	Command []string  `yaml:"command"`
	Args    []string  `yaml:"args"`
	Ports   []k8sPort `yaml:"ports"`
	EnvFrom []struct {
		ConfigMapRef struct{ Name string } `yaml:"configMapRef"`
	} `yaml:"envFrom"`
	Env []struct {
		Name      string `yaml:"name"`
		ValueFrom struct {
			SecretKeyRef struct{ Name, Key string } `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	Liveness     *k8sProbe `yaml:"livenessProbe"`
	Readiness    *k8sProbe `yaml:"readinessProbe"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

// loadK8s returns every object under deploy/k8s by "Kind/name", and the
// manifest files.
func loadK8s(t *testing.T) (map[string]k8sObject, []string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "k8s", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	objs := map[string]k8sObject{}
	var names []string
	for _, f := range files {
		rel, _ := filepath.Rel(deployDir, f)
		names = append(names, filepath.Base(f))
		for i, o := range yamlDocs[k8sObject](t, rel) {
			require.True(t, o.APIVersion != "" && o.Kind != "" && o.Metadata.Name != "",
				"%s document %d needs apiVersion, kind and metadata.name", rel, i+1)
			objs[o.Kind+"/"+o.Metadata.Name] = o
		}
	}
	return objs, names
}

func TestDeployKubernetes(t *testing.T) {
	inLane(t, lanes.general)
	objs, files := loadK8s(t)
	kust, ok := objs["Kustomization/telemetryd"]
	require.True(t, ok, "kustomization.yaml")
	assert.ElementsMatch(t, slices.DeleteFunc(files, func(f string) bool { return f == "kustomization.yaml" }),
		kust.Resources, "kustomization resources must list every manifest")

	sts, ok := objs["StatefulSet/telemetryd"]
	require.True(t, ok)
	require.NotNil(t, sts.Spec.Replicas)
	assert.Equal(t, 1, *sts.Spec.Replicas, "the data dir is locked by one process")
	assert.Contains(t, objs, "Service/"+sts.Spec.ServiceName, "StatefulSet serviceName")
	var sel struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	require.NoError(t, sts.Spec.Selector.Decode(&sel))
	labels := sts.Spec.Template.Metadata.Labels
	assertSubset(t, sel.MatchLabels, labels, "StatefulSet selector")
	require.Len(t, sts.Spec.Template.Spec.Containers, 1)
	c := sts.Spec.Template.Spec.Containers[0]
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	assert.Equal(t, map[string]int{"http": 8080, "nats": 4222}, ports)
	require.NotNil(t, c.Liveness)
	require.NotNil(t, c.Readiness)
	assert.Equal(t, "/healthz", c.Liveness.HTTPGet.Path)
	assert.Equal(t, "/readyz", c.Readiness.HTTPGet.Path)
	assert.Contains(t, ports, c.Readiness.HTTPGet.Port)
	for _, r := range []string{"cpu", "memory"} {
		assert.NotEmpty(t, c.Resources.Requests[r], "requests.%s", r)
	}
	assert.NotEmpty(t, c.Resources.Limits["memory"])
	require.Len(t, sts.Spec.Claims, 1)
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	assert.Equal(t, sts.Spec.Claims[0].Metadata.Name, mounts["/data"], "the claim is not mounted at /data")
	assert.Equal(t, []string{"telemetryd"}, c.Command, "plain telemetryd, so the ConfigMap's settings apply")

	checkPodRefs(t, objs, c)
	cm := objs["ConfigMap/"+c.EnvFrom[0].ConfigMapRef.Name]
	checkEnvKeys(t, "k8s ConfigMap", slices.Collect(maps.Keys(cm.Data)))
	assert.Equal(t, "/data", cm.Data["TELEMETRY_DATA_DIR"])
	assert.Equal(t, ":8080", cm.Data["TELEMETRY_HTTP_ADDR"])
	assert.Equal(t, "0.0.0.0:4222", cm.Data["TELEMETRY_NATS_LISTEN"])
	assert.Equal(t, "", cm.Data["TELEMETRY_MQTT_LISTEN"], "MQTT is bound only where devices use it")
	for k, mount := range map[string]string{"TELEMETRY_AUTH_FILE": "auth", "TELEMETRY_TLS_CERT": "tls", "TELEMETRY_TLS_KEY": "tls"} {
		require.NotEmpty(t, cm.Data[k], k)
		assert.Equal(t, mount, mounts[filepath.Dir(cm.Data[k])], "%s is not on the %s volume", k, mount)
	}
	assert.Equal(t, "HTTPS", c.Readiness.HTTPGet.Scheme)
	assert.Equal(t, "HTTPS", c.Liveness.HTTPGet.Scheme)

	svc, ok := objs["Service/telemetryd"]
	require.True(t, ok)
	var svcSel map[string]string
	require.NoError(t, svc.Spec.Selector.Decode(&svcSel))
	assertSubset(t, svcSel, labels, "Service selector")
	for _, p := range svc.Spec.Ports {
		assert.Equal(t, ports[p.TargetPort], p.Port, "Service port %s", p.Name)
	}
	checkRetentionCronJob(t, objs, svc)
}

func assertSubset(t *testing.T, sub, of map[string]string, what string) {
	t.Helper()
	assert.NotEmpty(t, sub, what)
	for k, v := range sub {
		assert.Equal(t, v, of[k], "%s %s does not match the pod labels", what, k)
	}
}

// checkPodRefs checks that the ConfigMaps and Secret keys c refers to
// exist.
func checkPodRefs(t *testing.T, objs map[string]k8sObject, c k8sContainer) {
	t.Helper()
	for _, ef := range c.EnvFrom {
		assert.Contains(t, objs, "ConfigMap/"+ef.ConfigMapRef.Name)
	}
	for _, e := range c.Env {
		if ref := e.ValueFrom.SecretKeyRef; ref.Name != "" {
			s, ok := objs["Secret/"+ref.Name]
			assert.True(t, ok, "env %s: Secret %s", e.Name, ref.Name)
			assert.Contains(t, s.StringData, ref.Key, "env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
		}
	}
}

func checkRetentionCronJob(t *testing.T, objs map[string]k8sObject, svc k8sObject) {
	t.Helper()
	cj, ok := objs["CronJob/telemetryd-retention"]
	require.True(t, ok)
	cs := cj.Spec.JobTemplate.Spec.Template.Spec.Containers
	require.Len(t, cs, 1)
	checkPodRefs(t, objs, cs[0])
	call := strings.Join(append(slices.Clone(cs[0].Command), cs[0].Args...), " ")
	assert.Contains(t, call, "-X POST")
	assert.Contains(t, call, "Authorization: Bearer $(TELEMETRY_ADMIN_TOKEN)")
	var http int
	for _, p := range svc.Spec.Ports {
		if p.Name == "http" {
			http = p.Port
		}
	}
	assert.Contains(t, call, "https://"+svc.Metadata.Name+":"+strconv.Itoa(http)+"/v1/retention/run")
	var fromSecret bool
	for _, e := range cs[0].Env {
		fromSecret = fromSecret || (e.Name == "TELEMETRY_ADMIN_TOKEN" && e.ValueFrom.SecretKeyRef.Name != "")
	}
	assert.True(t, fromSecret, "the CronJob's token must come from a Secret")
}

// unitFile parses a systemd unit into section -> key -> values.
func unitFile(t *testing.T, rel string) map[string]map[string][]string {
	t.Helper()
	out := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(readDeploy(t, rel)))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line
			out[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok && section != "", "%s:%d: %q is not key=value inside a section", rel, n, line)
			out[section][k] = append(out[section][k], v)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

func TestDeploySystemdUnit(t *testing.T) {
	inLane(t, lanes.general)
	u := unitFile(t, "systemd/telemetryd.service")
	for _, s := range []string{"[Unit]", "[Service]", "[Install]"} {
		require.Contains(t, u, s)
	}
	svc := u["[Service]"]
	require.Len(t, svc["ExecStart"], 1)
	assert.True(t, filepath.IsAbs(strings.Fields(svc["ExecStart"][0])[0]), "ExecStart needs an absolute path")
	assert.True(t, slices.Contains(svc["DynamicUser"], "yes") || len(svc["User"]) > 0, "runs as root")
	for k, want := range map[string]string{
		"StateDirectory": "telemetry", "ProtectSystem": "strict", "NoNewPrivileges": "yes",
		"Restart": "on-failure", "TimeoutStopSec": "20",
	} {
		assert.Equal(t, []string{want}, svc[k], k)
	}
	assert.NotEmpty(t, svc["LimitNOFILE"])
	assert.Contains(t, svc["Environment"], "TELEMETRY_DATA_DIR=/var/lib/telemetry", "data dir is not the StateDirectory")
	assert.NotEmpty(t, u["[Install]"]["WantedBy"])

	env := envFile(t, "systemd/telemetryd.env")
	checkEnvKeys(t, "systemd/telemetryd.env", slices.Collect(maps.Keys(env)))
	assert.Equal(t, "/var/lib/telemetry", env["TELEMETRY_DATA_DIR"])
	assert.NotEmpty(t, svc["ExecReload"], "systemctl reload re-reads the auth file")
	cfg := DefaultConfig()
	require.NoError(t, cfg.parseFlags("telemetryd", nil, envMap(env), io.Discard),
		"the unit's environment passes the start-up checks (auth file and TLS for its listeners)")
	assert.NotEmpty(t, cfg.Security.AuthFile)
	assert.NotEmpty(t, cfg.Security.TLSCert)
}

// envFile parses VARIABLE=value lines; '#' starts a comment line.
// Commented-out assignments are returned under "#VARIABLE".
func envFile(t *testing.T, rel string) map[string]string {
	t.Helper()
	out := map[string]string{}
	assign := regexp.MustCompile(`^(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$`)
	for n, line := range strings.Split(string(readDeploy(t, rel)), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		m := assign.FindStringSubmatch(line)
		if m == nil {
			require.True(t, strings.HasPrefix(line, "#"), "%s:%d: %q is neither a comment nor VARIABLE=value", rel, n+1, line)
			continue
		}
		value := m[3]
		assert.False(t, m[1] == "" && strings.ContainsAny(value, `"'`), "%s:%d: quotes would be taken literally by docker --env-file", rel, n+1)
		key := m[2]
		if m[1] != "" {
			key = "#" + key
		}
		out[key] = value
	}
	return out
}

func TestDeployEnvSample(t *testing.T) {
	inLane(t, lanes.general)
	env := envFile(t, "telemetryd.env.sample")
	text := string(readDeploy(t, "telemetryd.env.sample"))
	names := slices.Collect(maps.Keys(serviceFlags))
	sort.Strings(names)
	for _, f := range names {
		v, ok := env[envVar("TELEMETRY_", f)]
		if assert.True(t, ok, "no %s", envVar("TELEMETRY_", f)) {
			assert.Equal(t, serviceFlags[f], v, "%s default", envVar("TELEMETRY_", f))
		}
	}
	// Every flag of the service is there, with its default as the flag
	// reads it, and a comment.
	all := flag.NewFlagSet("", flag.ContinueOnError)
	c := DefaultConfig()
	c.bind(all)
	all.VisitAll(func(f *flag.Flag) {
		key := envName(f.Name)
		assert.True(t, strings.Contains(text, "# -"+f.Name+":"), "no comment explaining -%s", f.Name)
		v, ok := env[key]
		if !assert.True(t, ok, "no %s", key) || v == "" {
			assert.True(t, !ok || f.DefValue == "" || f.DefValue == "[]", "%s is empty, but -%s defaults to %q", key, f.Name, f.DefValue)
			return
		}
		fresh := flag.NewFlagSet("", flag.ContinueOnError)
		d := DefaultConfig()
		d.bind(fresh)
		g := fresh.Lookup(f.Name)
		if assert.NoError(t, g.Value.Set(v), key) {
			assert.Equal(t, f.DefValue, g.Value.String(), "%s=%s is not the default of -%s", key, v, f.Name)
		}
	})
	checkEnvKeys(t, "telemetryd.env.sample", slices.Collect(maps.Keys(env)))
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER"} {
		_, set := env[k]
		_, example := env["#"+k]
		assert.True(t, set || example, "no %s example", k)
	}
}

func TestDeployDockerfile(t *testing.T) {
	inLane(t, lanes.general)
	df := string(readDeploy(t, "Dockerfile"))
	assert.Regexp(t, `(?m)^ARG GO_VERSION=1\.26$`, df)
	assert.Regexp(t, `(?m)^FROM golang:\$\{GO_VERSION\} AS build$`, df)
	assert.Regexp(t, `(?s)go build [^\n]*(\\\n[^\n]*)*\./cmd/telemetryd \./cmd/telemetry-sim`, df)
	assert.Regexp(t, `(?m)^VOLUME /data$`, df)
	assert.Regexp(t, `(?m)^EXPOSE 8080 4222$`, df)
	user := regexp.MustCompile(`(?m)^USER (\S+)$`).FindStringSubmatch(df)
	require.NotNil(t, user, "no USER")
	assert.NotContains(t, []string{"root", "0", "0:0"}, user[1])
	ep := regexp.MustCompile(`(?m)^ENTRYPOINT (\[.*\])$`).FindStringSubmatch(df)
	require.NotNil(t, ep, "no exec-form ENTRYPOINT")
	var argv []string
	require.NoError(t, json.Unmarshal([]byte(ep[1]), &argv))
	assert.Equal(t, []string{"telemetryd", "-data-dir", "/data", "-http-addr", ":8080", "-nats-listen", "0.0.0.0:4222",
		"-auth-file", "/etc/telemetryd/auth.json", "-tls-cert", "/etc/telemetryd/tls.crt", "-tls-key", "/etc/telemetryd/tls.key"}, argv)
	_, port, err := net.SplitHostPort(argv[6])
	require.NoError(t, err)
	assert.Equal(t, "4222", port)
	cfg := DefaultConfig()
	require.NoError(t, cfg.parseFlags("telemetryd", argv[1:], envMap(nil), io.Discard), "the image's flags pass the start-up checks")

	readme := string(readDeploy(t, "README.md"))
	assert.True(t, strings.Contains(readme, "docker build -f deploy/Dockerfile"), "README does not say how to build the image")
	for _, f := range []string{"Dockerfile", "compose.yaml", "otel-collector.yaml", "prometheus.yml", "k8s/",
		"systemd/telemetryd.service", "systemd/telemetryd.env", "telemetryd.env.sample", "grafana/dashboards/telemetry.json"} {
		assert.True(t, strings.Contains(readme, "`"+f), "README does not describe %s", f)
	}
}
