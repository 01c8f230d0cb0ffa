package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// promtoolMatrix is what `promtool query range -o json` prints: the
// result of a range query.
type promtoolMatrix []struct {
	Metric map[string]string `json:"metric"`
	Values [][2]any          `json:"values"` // [unix seconds, "value"]
}

// TestPromtoolQueryRange drives the PromQL API with a second client no
// one here wrote: promtool from Debian's prometheus package (.ci/run
// installs it). Without promtool the test skips, except under CI.
func TestPromtoolQueryRange(t *testing.T) {
	inLane(t, lanes.general)
	bin, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not installed; .ci/run installs Debian's prometheus package")
		}
		t.Skip("promtool not installed (apt-get install prometheus)")
	}
	f := newPromFixture(t)
	start, end, step := f.now.Add(-3*time.Hour), f.now.Add(-time.Hour), 10*time.Minute
	run := func(t *testing.T, expr string) promtoolMatrix {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), bin, "query", "range", "-o", "json",
			"--start", start.Format(time.RFC3339), "--end", end.Format(time.RFC3339), "--step", step.String(),
			f.env.base, expr)
		out, err := cmd.Output()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("promtool %s: %v: %s", expr, err, ee.Stderr)
		}
		require.NoError(t, err)
		var m promtoolMatrix
		require.NoError(t, json.Unmarshal(out, &m), "%s", out)
		return m
	}
	// check compares one series' points with want at every step.
	check := func(t *testing.T, m promtoolMatrix, want func(time.Time) (float64, bool)) {
		t.Helper()
		require.Len(t, m, 1)
		assert.Equal(t, "d1", m[0].Metric["device"])
		var gotT, expT []int64
		var gotV, expV []float64
		for _, p := range m[0].Values {
			sec, ok := p[0].(float64)
			require.True(t, ok, "timestamp %v", p[0])
			s, ok := p[1].(string)
			require.True(t, ok, "value %v", p[1])
			v, err := strconv.ParseFloat(s, 64)
			require.NoError(t, err)
			gotT, gotV = append(gotT, int64(sec)), append(gotV, v)
		}
		for ts := start; !ts.After(end); ts = ts.Add(step) {
			if v, ok := want(ts); ok {
				expT, expV = append(expT, ts.Unix()), append(expV, v)
			}
		}
		require.NotEmpty(t, expT)
		require.Equal(t, expT, gotT, "the steps that have a value")
		assert.InDeltaSlice(t, expV, gotV, 1e-9)
	}

	t.Run("selector", func(t *testing.T) {
		m := run(t, `temp{device="d1"}`)
		assert.Equal(t, "temp", m[0].Metric["__name__"])
		check(t, m, func(ts time.Time) (float64, bool) { return latestAt(f.d1, ts) })
	})
	t.Run("avg_over_time", func(t *testing.T) {
		m := run(t, `avg_over_time(temp{device="d1"}[1h])`)
		check(t, m, func(ts time.Time) (float64, bool) { return avgOver(f.d1, ts, time.Hour) })
	})
}
