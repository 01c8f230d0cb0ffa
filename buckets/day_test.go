package buckets_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func mustDay(t *testing.T, s string) buckets.Day {
	t.Helper()
	d, err := buckets.ParseDay(s)
	require.NoError(t, err)
	return d
}

func mustTicks(t *testing.T, s string) buckets.Ticks {
	t.Helper()
	k, err := buckets.ParseTime(s)
	require.NoError(t, err)
	return k
}

func TestDayOfBoundary(t *testing.T) {
	lastTick := mustTicks(t, "2026-11-22T23:59:59.9999999Z")
	midnight := mustTicks(t, "2026-11-23T00:00:00Z")
	require.Equal(t, lastTick+1, midnight)

	assert.Equal(t, "2026-11-22", buckets.DayOf(lastTick).String())
	assert.Equal(t, "2026-11-23", buckets.DayOf(midnight).String())
	assert.Equal(t, buckets.DayOf(lastTick)+1, buckets.DayOf(midnight))
	assert.Equal(t, "2026-11-22", buckets.DayOf(mustTicks(t, "2026-11-22T00:00:00Z")).String())

	// An offset moves the instant, and the day is the UTC one.
	assert.Equal(t, "2026-11-23", buckets.DayOf(mustTicks(t, "2026-11-22T23:30:00-01:00")).String())
	assert.Equal(t, "2026-11-21", buckets.DayOf(mustTicks(t, "2026-11-22T00:30:00+01:00")).String())

	assert.Equal(t, "2026-11-23", buckets.DayOfTime(time.Date(2026, 11, 22, 23, 0, 0, 0, time.FixedZone("m1", -3600))).String())
}

func TestDayRoundTrip(t *testing.T) {
	tests := []struct {
		s   string
		day buckets.Day
	}{
		{"0001-01-01", 0},
		{"0001-01-02", 1},
		{"1970-01-01", 719162},
		{"2026-11-22", 739941},
		{"2028-02-29", 740405},
		{"9999-12-31", 3652058},
	}
	for _, tc := range tests {
		d := mustDay(t, tc.s)
		assert.Equal(t, tc.day, d, tc.s)
		assert.Equal(t, tc.s, d.String())
		assert.Equal(t, d, buckets.DayOf(d.Start()))
		assert.Equal(t, d, buckets.DayOf(d.End()-1))
		assert.Equal(t, tc.s+"T00:00:00Z", d.Start().FormatTime())
	}
}

func TestParseDayErrors(t *testing.T) {
	for _, s := range []string{"", "2026-11-22T00:00:00Z", "2026-13-01", "2026-02-30", "2026-1-1", "26-11-22",
		"2026/11/22", "10000-01-01", "0000-01-01", "0000-12-31", " 2026-11-22"} {
		d, err := buckets.ParseDay(s)
		require.Error(t, err, "%q parsed as %s", s, d)
		assert.Contains(t, err.Error(), `"`+s+`"`)
	}
}

func TestDayStartEnd(t *testing.T) {
	d := mustDay(t, "2026-11-22")
	assert.Equal(t, mustTicks(t, "2026-11-22T00:00:00Z"), d.Start())
	assert.Equal(t, mustTicks(t, "2026-11-23T00:00:00Z"), d.End())
	assert.Equal(t, buckets.Ticks(buckets.TicksPerDay), d.End()-d.Start())
	assert.Equal(t, (d + 1).Start(), d.End())

	last := mustDay(t, "9999-12-31")
	assert.Equal(t, buckets.MaxTicks, last.End()-1, "the last day ends one tick past MaxTicks")
	assert.Equal(t, "9999-12-31T00:00:00Z", last.Start().Time().Format(time.RFC3339))
}

func TestPartitionKey(t *testing.T) {
	d := mustDay(t, "2026-11-22")
	assert.Equal(t, "dev-1/2026-11-22", buckets.PartitionKey("dev-1", d))
	assert.Equal(t, "A_b-9/0001-01-01", buckets.PartitionKey("A_b-9", 0))
}
