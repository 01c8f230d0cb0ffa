package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// Every reading of a run must be inside the service's accepted window
// when it is published, or the service refuses it and the check counts
// it lost. A run of 6,300,000 readings at 5,000/s once stamped the last
// 1.4 million more than five minutes ahead of the clock.
func TestReadingsBaseKeepsReadingsInsideTheWindow(t *testing.T) {
	now := time.Date(2026, 11, 25, 19, 16, 0, 0, time.UTC)
	for _, n := range []int{1, 500_000, 3_600_000, 6_300_000, 20_000_000} {
		base := readingsBase(now, n)
		newest := buckets.MustTicks(base.Add(time.Duration(n-1) * time.Millisecond))
		oldest := buckets.MustTicks(base)
		require.NoError(t, buckets.DefaultWindow.Check(newest, now), "%d readings: the newest at the start", n)
		require.NoError(t, buckets.DefaultWindow.Check(oldest, now.Add(24*time.Hour)), "%d readings: the oldest a day later", n)
		assert.False(t, base.After(now.Add(-time.Hour)), "%d readings: at least an hour back", n)
		assert.Equal(t, base, base.Truncate(time.Second))
	}
}
