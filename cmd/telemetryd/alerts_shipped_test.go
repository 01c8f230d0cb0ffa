package main

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/telemetryd/telemetryd/api/promapi"
	"github.com/telemetryd/telemetryd/api/rules"
	"github.com/telemetryd/telemetryd/buckets"
)

// promtoolBin finds promtool: it skips the test without it, except
// under CI, which installs it.
func promtoolBin(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not installed; .ci/run installs Debian's prometheus package")
		}
		t.Skip("promtool not installed (apt-get install prometheus); the shipped alert rules are not checked")
	}
	return bin
}

// promtoolTests is the part of a `promtool test rules` file this test
// reads.
type promtoolTests struct {
	Tests []struct {
		Interval    model.Duration `yaml:"interval"`
		InputSeries []struct {
			Series string `yaml:"series"`
			Values string `yaml:"values"`
		} `yaml:"input_series"`
	} `yaml:"tests"`
}

// TestShippedAlertRules: `promtool check rules` accepts every file of
// deploy/alerts and the service loads them; `promtool test rules`
// passes for every unit-test file of deploy/alerts/tests, and the input
// series of those files are exactly what the PromQL API answers when
// the same readings (and attributes) are stored: the same names,
// labels and values at every step.
func TestShippedAlertRules(t *testing.T) {
	inLane(t, lanes.general)
	bin := promtoolBin(t)
	dir, err := filepath.Abs("../../deploy/alerts")
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(dir, "*.yml"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 3, "devices, values and fleet rules")
	for _, f := range files {
		out, err := exec.CommandContext(t.Context(), bin, "check", "rules", f).CombinedOutput()
		require.NoError(t, err, "promtool check rules %s: %s", f, out)
	}
	_, err = rules.Load([]string{filepath.Join(dir, "*.yml")}, 0)
	require.NoError(t, err, "-rules '%s/*.yml'", dir)

	tests, err := filepath.Glob(filepath.Join(dir, "tests", "*_test.yml"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(tests), 3)
	for _, f := range tests {
		t.Run(filepath.Base(f), func(t *testing.T) {
			checkInputSeries(t, f)
			out, err := exec.CommandContext(t.Context(), bin, "test", "rules", f).CombinedOutput()
			require.NoError(t, err, "promtool test rules %s: %s", f, out)
		})
	}
}

// checkInputSeries stores readings that make the input series of the
// unit-test file f and compares the API's answer with them. A
// last-seen series' values are seconds from the start of the test
// (promtool's clock starts at 0): readings are stored at those times.
func checkInputSeries(t *testing.T, f string) {
	b, err := os.ReadFile(f)
	require.NoError(t, err)
	var pt promtoolTests
	require.NoError(t, yaml.Unmarshal(b, &pt))
	require.NotEmpty(t, pt.Tests)
	now := testEpoch
	e := newDashEnv(t, now)
	p := parser.NewParser(parser.Options{})
	for _, tc := range pt.Tests {
		step := time.Duration(tc.Interval)
		require.Positive(t, step)
		require.NotEmpty(t, tc.InputSeries)
		for _, in := range tc.InputSeries {
			lset, seq, err := p.ParseSeriesDesc(in.Series + " " + in.Values)
			require.NoError(t, err, in.Series)
			name, dev := lset.Get(model.MetricNameLabel), lset.Get("device")
			require.NotEmpty(t, dev, "%s: a series of the API has a device label", in.Series)
			start := now.Add(-time.Duration(len(seq)) * step)
			attrs := buckets.Attributes{}
			for k, v := range lset.Map() {
				if k != model.MetricNameLabel && k != "device" {
					attrs = append(attrs, buckets.Attribute{Name: k, Value: v})
				}
			}
			if len(attrs) > 0 {
				require.NoError(t, e.st.Assign(context.Background(), []buckets.Assignment{{Device: buckets.DeviceID(dev),
					At: buckets.MustTicks(start.Add(-time.Hour)), Set: attrs}}))
			}
			var rs []buckets.Reading
			want := make([]float64, len(seq))
			for i, sv := range seq {
				require.False(t, sv.Omitted, "%s: no gaps: the API's lookback would fill them", in.Series)
				want[i] = sv.Value
				at := start.Add(time.Duration(i) * step)
				if name == promapi.LastSeenName {
					at = start.Add(time.Duration(sv.Value * float64(time.Second)))
					if i > 0 && sv.Value == seq[i-1].Value {
						continue
					}
					rs = append(rs, newReading(dev, buckets.MustTicks(at), buckets.Field{Name: "count", Value: buckets.Float(1)}))
					continue
				}
				rs = append(rs, newReading(dev, buckets.MustTicks(at), buckets.Field{Name: name, Value: buckets.Float(sv.Value)}))
			}
			e.write(t, rs...)

			var res struct {
				Data struct {
					Result []promSeries `json:"result"`
				} `json:"data"`
			}
			end := start.Add(time.Duration(len(seq)-1) * step)
			q := url.Values{"query": {name + `{device="` + dev + `"}`}, "step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)},
				"start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)}}
			status, body := e.getJSON(t, "/api/v1/query_range", q, &res)
			require.Equal(t, 200, status, "%s", body)
			require.Len(t, res.Data.Result, 1, "%s", body)
			got := res.Data.Result[0]
			assert.Equal(t, lset.Map(), got.Metric, "the labels of %s", in.Series)
			vals := make([]float64, 0, len(got.Values))
			for i, pv := range got.Values {
				ts, v := pointValue(t, pv)
				require.Equal(t, start.Add(time.Duration(i)*step), ts, "%s: a point at every step", in.Series)
				if name == promapi.LastSeenName {
					v -= float64(start.Unix())
				}
				vals = append(vals, v)
			}
			assert.Equal(t, want, vals, "the values of %s", in.Series)
		}
	}
}
