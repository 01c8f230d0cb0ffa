package ingest

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRejectedFloodLogsBoundedLines: a flood of invalid messages is
// dead-lettered and counted in full, but logs at most the sample.
func TestRejectedFloodLogsBoundedLines(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	const n = 2000
	for i := range n {
		require.NoError(t, e.nc.Publish("telemetry.dev-flood", []byte(`{"ts":"never","i":`+string(rune('0'+i%10))+`}`)))
	}
	require.NoError(t, e.nc.Flush())
	require.Eventually(t, func() bool { return e.counter("telemetry.ingest.messages", outcome("rejected")) == n },
		60*time.Second, 50*time.Millisecond, "every invalid message is counted")
	lines := strings.Count(e.logs.String(), `msg="message rejected"`)
	assert.LessOrEqual(t, lines, 3*rejectLogBurst, "at most a sample per interval (the flood takes under 3 intervals)")
	assert.GreaterOrEqual(t, lines, 1, "the first rejections are logged")
}

func TestLogSampler(t *testing.T) {
	s := LogSampler{Burst: 2, Interval: time.Second}
	t0 := time.Unix(1000, 0)
	ok, _ := s.Allow(t0)
	assert.True(t, ok)
	ok, _ = s.Allow(t0)
	assert.True(t, ok)
	for range 5 {
		ok, _ = s.Allow(t0.Add(time.Millisecond))
		assert.False(t, ok, "past the burst within the interval")
	}
	ok, held := s.Allow(t0.Add(time.Second))
	assert.True(t, ok, "a new interval")
	assert.Equal(t, int64(5), held, "the held-back count rides on the next line")
}
