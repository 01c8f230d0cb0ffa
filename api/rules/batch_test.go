package rules

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

type batchKey struct{}

type nopRecorder struct{}

func (nopRecorder) Record(context.Context, []buckets.Reading) error { return nil }

// TestBatchPerEvaluation: the queries of one group evaluation share the
// context Config.Batch returns, and a recording rule ends the batch, so
// the rules after it read what it wrote (and query again the operands
// the rules before it shared).
func TestBatchPerEvaluation(t *testing.T) {
	gs, err := Load([]string{writeFile(t, "batch.yml", `groups:
  - name: b
    interval: 15s
    rules:
      - alert: A
        expr: a > 0
      - alert: B
        expr: b > 0
      - record: c
        expr: a
        labels: {device: d}
      - alert: C
        expr: c > 0
      - alert: D
        expr: a > 5
`)}, 0)
	require.NoError(t, err)
	batches := 0
	seen := map[string]int{} // expression → batch it was queried in
	m, err := NewManager(Config{
		Query: func(ctx context.Context, expr string, ts time.Time) (promql.Vector, error) {
			n, _ := ctx.Value(batchKey{}).(int)
			seen[expr] = n
			return promql.Vector{{Metric: labels.FromStrings("device", "d"), F: 1, T: ts.UnixMilli()}}, nil
		},
		Batch: func(ctx context.Context) context.Context {
			batches++
			return context.WithValue(ctx, batchKey{}, batches)
		},
		Recorder: nopRecorder{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	m.Update(gs)
	t.Cleanup(m.Stop)
	require.NoError(t, m.EvalAt(t.Context(), "b", time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)))
	// The thresholds query their operand (shared.go): a once per batch.
	assert.Equal(t, map[string]int{"a": 2, "b": 1, "c": 2}, seen)
	require.NoError(t, m.EvalAt(t.Context(), "b", time.Date(2026, 12, 1, 12, 0, 15, 0, time.UTC)))
	assert.Equal(t, map[string]int{"a": 4, "b": 3, "c": 4}, seen)
}
