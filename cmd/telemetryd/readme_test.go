package main

import (
	"flag"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/getkin/kin-openapi/openapi3"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/promapi"
	"github.com/telemetryd/telemetryd/cmd/internal/authcli"
	"github.com/telemetryd/telemetryd/cmd/internal/backupcli"
	"github.com/telemetryd/telemetryd/cmd/internal/exportcli"
	"github.com/telemetryd/telemetryd/cmd/internal/repaircli"
)

// A documented example is a promise. These tests check every name the
// README and the reference pages give to users against the code: flags
// (the configuration reference itself is generated, see
// configdoc_test.go), endpoints, error codes and metric names.

// userDocs are the pages written for users, relative to the
// repository root.
var userDocs = []string{
	"README.md",
	"SECURITY.md",
	"ingest/README.md",
	"api/README.md",
	"store/README.md",
	"retention/README.md",
	"deploy/README.md",
	"deploy/CLUSTER.md",
	"cmd/telemetryd/CONFIGURATION.md",
	"cmd/telemetryd/OPERATIONS.md",
}

// docFile returns one page of userDocs.
func docFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(name)))
	require.NoError(t, err)
	return string(b)
}

// readme returns every page of userDocs, one after the other.
func readme(t *testing.T) string {
	t.Helper()
	var all strings.Builder
	for _, name := range userDocs {
		all.WriteString(docFile(t, name))
		all.WriteString("\n")
	}
	return all.String()
}

// section returns the text of doc from the heading "## name" to the
// next "## " heading.
func section(t *testing.T, doc, name string) string {
	t.Helper()
	start := strings.Index(doc, "\n## "+name+"\n")
	require.NotEqual(t, -1, start, "the page has a section %q", name)
	rest := doc[start+1:]
	if end := strings.Index(rest[3:], "\n## "); end >= 0 {
		return rest[:end+3]
	}
	return rest
}

// serviceFlagSet and retentionFlags are the flag sets of telemetryd and
// of telemetryd retention.
func serviceFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("telemetryd", flag.ContinueOnError)
	cfg := DefaultConfig()
	cfg.bind(fs)
	fs.Bool("version", false, "")
	return fs
}

func retentionFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("retention", flag.ContinueOnError)
	cfg := DefaultConfig()
	cfg.bindRetention(fs)
	fs.Bool("dry-run", false, "")
	return fs
}

// TestReadmeFlags: every telemetryd command line in the documentation
// uses flags that exist (CONFIGURATION.md lists them all: see
// TestConfigurationReference).
func TestReadmeFlags(t *testing.T) {
	inLane(t, lanes.general)
	doc := readme(t)
	fs := serviceFlagSet()
	// Command lines: `telemetryd ...` and `go run ./cmd/telemetryd ...`.
	cmd := regexp.MustCompile(`(?:^|[\s` + "`" + `])(?:go run \./cmd/)?telemetryd((?: +[^\s#` + "`" + `]+)*)`)
	ret := retentionFlags()
	uses := 0
	for _, line := range strings.Split(doc, "\n") {
		if strings.Contains(line, "journalctl") || strings.Contains(line, "systemctl") {
			continue // the unit's name, not the command
		}
		for _, m := range cmd.FindAllStringSubmatch(line, -1) {
			args := strings.Fields(m[1])
			set := fs
			if len(args) > 0 && args[0] == "retention" {
				set, args = ret, args[1:]
			}
			if len(args) > 0 && args[0] == "auth" {
				set, args = authcli.FlagSet(io.Discard), args[1:]
			}
			if len(args) > 0 && args[0] == "export" {
				set, args = exportcli.FlagSet(io.Discard, shared(os.Getenv, io.Discard)), args[1:]
			}
			if len(args) > 0 && args[0] == "backup" {
				set = backupcli.BackupFlagSet(io.Discard, shared(os.Getenv, io.Discard))
				args = args[1:]
			}
			if len(args) > 0 && args[0] == "repair" {
				set, args = repaircli.FlagSet(io.Discard, shared(os.Getenv, io.Discard)), args[1:]
			}
			if len(args) > 0 && args[0] == "restore" {
				set = backupcli.RestoreFlagSet(io.Discard, shared(os.Getenv, io.Discard))
				args = args[1:]
			}
			for _, a := range args {
				if !strings.HasPrefix(a, "-") {
					continue
				}
				name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if name == "h" || name == "help" {
					continue
				}
				uses++
				assert.NotNil(t, set.Lookup(name), "README line %q uses %s, which %s does not have", strings.TrimSpace(line), a, set.Name())
			}
		}
	}
	assert.Greater(t, uses, 3, "the command lines were found")
	assert.NotContains(t, doc, "date -d", "GNU-only date -d")
	assert.NotContains(t, doc, "date -u -d", "GNU-only date -d")
}

// normPath turns "/v1/devices/{device}/readings?x=1" into
// "/v1/devices/{}/readings".
func normPath(p string) string {
	p, _, _ = strings.Cut(p, "?")
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
			segs[i] = "{}"
		}
	}
	return strings.Join(segs, "/")
}

// matchTemplate reports whether a concrete path matches a normalized
// template.
func matchTemplate(path, tmpl string) bool {
	ps, ts := strings.Split(path, "/"), strings.Split(tmpl, "/")
	if len(ps) != len(ts) {
		return false
	}
	for i := range ps {
		if ts[i] != "{}" && ts[i] != ps[i] {
			return false
		}
	}
	return true
}

// TestReadmeEndpoints: every endpoint the README names is an operation
// of the OpenAPI document (which a test in api checks against the
// routes), every documented path is in the README, every URL of a curl
// example is a route, and the error codes are the API's.
func TestReadmeEndpoints(t *testing.T) {
	inLane(t, lanes.general)
	doc := readme(t)
	loader := openapi3.NewLoader()
	spec, err := loader.LoadFromData(api.OpenAPI())
	require.NoError(t, err)
	ops := map[string]bool{}
	var templates []string
	for p, item := range spec.Paths.Map() {
		templates = append(templates, normPath(p))
		for m := range item.Operations() {
			ops[m+" "+normPath(p)] = true
		}
	}

	named := regexp.MustCompile("`((?:GET|HEAD|POST|PUT|PATCH|DELETE)(?:\\|(?:GET|HEAD|POST|PUT|PATCH|DELETE))*) (/[^`\\s]*)`")
	inReadme := map[string]bool{}
	for _, m := range named.FindAllStringSubmatch(doc, -1) {
		p := normPath(m[2])
		inReadme[p] = true
		for _, method := range strings.Split(m[1], "|") {
			assert.True(t, ops[method+" "+p], "README names %s %s, which the API does not document", method, m[2])
		}
	}
	for _, tmpl := range templates {
		assert.True(t, inReadme[tmpl], "the API serves %s but the README does not name it", tmpl)
	}

	curl := regexp.MustCompile("(?:localhost|127\\.0\\.0\\.1):8080(/[^'\"\\s?<>`]*)")
	examples := 0
	for _, m := range curl.FindAllStringSubmatch(doc, -1) {
		examples++
		assert.True(t, slices.ContainsFunc(templates, func(tmpl string) bool { return matchTemplate(m[1], tmpl) }),
			"README example URL %s is not a route", m[1])
	}
	assert.Greater(t, examples, 5)

	// Error codes: the README lists exactly the codes of the Error schema.
	errSchema := spec.Components.Schemas["Error"].Value.Properties["error"].Value.Properties["code"].Value
	var codes []string
	for _, c := range errSchema.Enum {
		codes = append(codes, c.(string))
	}
	statusCode := regexp.MustCompile("[0-9]{3}\\s+`([a-z_]+)`")
	var listed []string
	for _, m := range statusCode.FindAllStringSubmatch(section(t, docFile(t, "api/README.md"), "Endpoints"), -1) {
		listed = append(listed, m[1])
	}
	slices.Sort(codes)
	slices.Sort(listed)
	assert.Equal(t, codes, slices.Compact(listed), "README's error codes and the API's")
}

// TestReadmeMetrics runs a service through a workload that moves every
// metric (ingest accepted and rejected, a nak and redelivery, queries,
// a damaged table, a retention drop), then checks that each metric the
// README names, with its labels, is exported at /metrics.
func TestReadmeMetrics(t *testing.T) {
	doc := readme(t)
	cfg := newTestConfig(t)
	s := startService(t, cfg)
	fillDays(t, s, "dev-m", []int{2, 1, 0}, 100)
	waitStored(t, s, "dev-m", 300)
	s.stop(t)

	// Damage yesterday's table; restart with a retention that expires
	// the day before it.
	yesterday := testEpoch.AddDate(0, 0, -1)
	dir := filepath.Join(cfg.DataDir, "tables", yesterday.Format("2006-01-02"))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		if e.Name() == "MANIFEST" || filepath.Ext(e.Name()) == ".sst" || filepath.Ext(e.Name()) == ".vlog" || filepath.Ext(e.Name()) == ".mem" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, e.Name()), []byte("not a badger file"), 0o644))
		}
	}
	cfg.Retention = 36 * time.Hour
	s = startService(t, cfg)
	q := url.Values{"from": {yesterday.Format(time.RFC3339)}, "to": {yesterday.Add(time.Hour).Format(time.RFC3339)}}
	code, body := s.get(t, "/v1/devices/dev-m/readings?"+q.Encode(), nil)
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	code, body = s.get(t, "/v1/devices/dev-m/readings/latest", nil)
	require.Equal(t, http.StatusOK, code, body)
	s.publish(t, "dev-m", `{"ts":`+strconv.FormatInt(testEpoch.UnixMilli(), 10)+`,"v":1}`)                // accepted
	s.publish(t, "dev-m", `{"ts":"not a time","v":1}`)                                                    // rejected
	s.publish(t, "dev-m", `{"ts":`+strconv.FormatInt(yesterday.Add(time.Hour).UnixMilli(), 10)+`,"v":1}`) // the damaged day: nak, redelivered

	family := regexp.MustCompile(`\b((?:telemetry|http_server)_[a-z_]+)(?:\{([a-z_,]+)\})?`)
	otelName := regexp.MustCompile("`(telemetry\\.[a-z_.]+)`")
	waitFor(t, 50*time.Millisecond, func() bool {
		mfs := scrape(t, s)
		return mfs["telemetry_ingest_redeliveries_total"] != nil && mfs["telemetry_ingest_lag_seconds"] != nil
	}, "the workload moves the redelivery counter and the lag histogram")
	mfs := scrape(t, s)
	var exported []string
	for name := range mfs {
		exported = append(exported, name)
	}
	hasPrefix := func(p string) bool {
		return slices.ContainsFunc(exported, func(n string) bool { return strings.HasPrefix(n, p) })
	}
	checked := 0
	for _, line := range strings.Split(doc, "\n") {
		for _, m := range family.FindAllStringSubmatch(line, -1) {
			name := m[1]
			if name == promapi.LastSeenName {
				continue // a series of the PromQL API, not of /metrics
			}
			checked++
			if strings.Contains(line, "grep") {
				assert.True(t, hasPrefix(name), "README greps /metrics for %s, which matches nothing", name)
				continue
			}
			base := name
			if mfs[base] == nil {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(name, suffix); ok && mfs[b] != nil {
						base = b
					}
				}
			}
			mf := mfs[base]
			if !assert.NotNil(t, mf, "README names metric %s; /metrics has %v", name, exported) {
				continue
			}
			if m[2] == "" {
				continue
			}
			for _, label := range strings.Split(m[2], ",") {
				assert.True(t, hasLabel(mf, label), "README says %s has label %s", base, label)
			}
		}
		for _, m := range otelName.FindAllStringSubmatch(line, -1) {
			checked++
			assert.True(t, hasPrefix(strings.ReplaceAll(m[1], ".", "_")), "README names instrument %s; /metrics has no such family", m[1])
		}
	}
	assert.Greater(t, checked, 20)
}

// hasLabel reports whether some series of mf carries label.
func hasLabel(mf *dto.MetricFamily, label string) bool {
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				return true
			}
		}
	}
	return false
}

// TestDocLengths keeps the README a front door and BENCHMARKS.md a
// current report: reference text belongs beside the code it describes,
// and past runs in the bench's dated history files.
func TestDocLengths(t *testing.T) {
	inLane(t, lanes.general)
	for _, c := range []struct {
		name string
		max  int
	}{{"README.md", 300}, {"BENCHMARKS.md", 800}} {
		lines := strings.Count(docFile(t, c.name), "\n")
		assert.LessOrEqual(t, lines, c.max, "%s has %d lines; move reference text beside the code it describes", c.name, lines)
	}
}

// linkedDocs are the pages whose links TestDocLinks checks: the user
// pages and the pages they link to.
var linkedDocs = append(slices.Clone(userDocs),
	"BENCHMARKS.md",
	"api/FLEET-QUERIES.md",
	"cmd/telemetry-bench/README.md",
	"cmd/telemetry-bench/history-2026-11.md",
	"cmd/telemetry-crashloop/README.md",
)

// mdLink is a markdown link or image: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^()\s]+)\)`)

// TestDocLinks: every relative link of the documentation names a file
// of the repository, and every #anchor a heading of its page.
func TestDocLinks(t *testing.T) {
	inLane(t, lanes.general)
	checked := 0
	for _, name := range linkedDocs {
		doc := docFile(t, name)
		for _, m := range mdLink.FindAllStringSubmatch(withoutCode(doc), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			page := name
			if file != "" {
				page = filepath.ToSlash(filepath.Join(filepath.Dir(name), file))
				if _, err := os.Stat(filepath.Join("..", "..", filepath.FromSlash(page))); err != nil {
					assert.NoError(t, err, "%s links to %s, which does not exist", name, target)
					continue
				}
			}
			checked++
			if anchor == "" {
				continue
			}
			assert.Contains(t, anchors(docFile(t, page)), anchor, "%s links to %s: %s has no heading with that anchor", name, target, page)
		}
	}
	assert.Greater(t, checked, 50, "the links were found")
}

// withoutCode drops fenced code blocks, whose brackets are not links.
func withoutCode(doc string) string {
	var out strings.Builder
	in := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			in = !in
			continue
		}
		if !in {
			out.WriteString(line)
			out.WriteString("\n")
		}
	}
	return out.String()
}

// anchors returns the anchors of a page's headings, as GitHub makes
// them: lower case, punctuation dropped, spaces as hyphens.
func anchors(doc string) []string {
	var out []string
	for _, line := range strings.Split(withoutCode(doc), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var a strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				a.WriteRune(r)
			}
		}
		out = append(out, a.String())
	}
	return out
}
