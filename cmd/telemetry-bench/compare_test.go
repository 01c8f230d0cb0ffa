package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCompareSideBySide compares a build with itself at a tiny size:
// both sides store the readings, answer every query, and the report
// gives one line per round with positive latencies and ratios.
func TestCompareSideBySide(t *testing.T) {
	if testing.Short() {
		t.Skip("starts telemetryd twice")
	}
	ctx := testContext(t)
	bin := serviceBinary(t)
	assert.True(t, hasFlag(bin, "mqtt-listen"))
	assert.False(t, hasFlag(bin, "no-such-flag"))
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-binary", bin, "-compare", bin, "-query-readings", "20000", "-devices", "5",
		"-queries", "30", "-repeat", "2", "-work-dir", t.TempDir(), "-progress", "0"}, &stdout, &stderr)
	require.Equal(t, 0, code, "stderr:\n%s", stderr.String())
	text := stdout.String()
	assert.Contains(t, text, "20000 readings over 5 devices; 30 pairs of each query per round")
	rounds := regexp.MustCompile(`(?m)^[12] +(.*)$`).FindAllStringSubmatch(text, -1)
	require.Len(t, rounds, 2, text)
	ratios := regexp.MustCompile(`ms (\d+\.\d{3})`)
	for _, r := range rounds {
		got := ratios.FindAllStringSubmatch(r[1], -1)
		require.Len(t, got, 4, r[1])
		for _, g := range got {
			v, err := strconv.ParseFloat(g[1], 64)
			require.NoError(t, err)
			assert.Greater(t, v, 0.0, "every figure was measured: %s", r[1])
		}
	}
	assert.Contains(t, text, "median B/A over 2 rounds")
}

func TestMedian(t *testing.T) {
	assert.Equal(t, 2.0, median([]float64{3, 1, 2}))
	assert.Equal(t, 2.5, median([]float64{4, 1, 3, 2}))
	assert.Equal(t, 0.0, median(nil))
}
