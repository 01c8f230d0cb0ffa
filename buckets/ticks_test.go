package buckets_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// The worked example of the contract (api/README.md).
var (
	exampleTime   = time.Date(2026, 11, 22, 1, 2, 3, 456_000_000, time.UTC)
	exampleMillis = int64(1795309323456)
	exampleTicks  = buckets.Ticks(639309061234560000)
	exampleRowKey = "2516069914765439999"
)

func TestContractExample(t *testing.T) {
	k, err := buckets.TicksOf(exampleTime)
	require.NoError(t, err)
	assert.Equal(t, exampleTicks, k)
	assert.Equal(t, exampleRowKey, k.RowKey())
	assert.Equal(t, "2026-11-22T01:02:03.456Z", k.FormatTime())

	fromMillis, err := buckets.TicksFromEpochMillis(exampleMillis)
	require.NoError(t, err)
	assert.Equal(t, exampleTicks, fromMillis)

	assert.Equal(t, "dev-1/2026-11-22", buckets.PartitionKey("dev-1", buckets.DayOf(k)))
	r := buckets.Reading{Device: "dev-1", Ticks: k}
	assert.Equal(t, "dev-1/2026-11-22", r.PartitionKey())
	assert.Equal(t, exampleRowKey, r.RowKey())
	assert.Equal(t, "2026-11-22", r.Day().String())
}

func TestTicksOfRange(t *testing.T) {
	first := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	last := time.Date(9999, 12, 31, 23, 59, 59, 999_999_900, time.UTC)
	tick := 100 * time.Nanosecond

	tests := []struct {
		name string
		in   time.Time
		want buckets.Ticks
	}{
		{"first instant", first, 0},
		{"first instant plus one tick", first.Add(tick), 1},
		{"unix epoch", time.Unix(0, 0), 621355968000000000},
		{"contract example", exampleTime, exampleTicks},
		{"same instant in another zone", exampleTime.In(time.FixedZone("x", -4*3600-1800)), exampleTicks},
		{"sub-tick nanoseconds truncate", exampleTime.Add(99), exampleTicks},
		{"one tick later", exampleTime.Add(tick), exampleTicks + 1},
		{"before 1970 truncates toward the past", time.Unix(-1, 50), 621355968000000000 - buckets.TicksPerSecond},
		{"last tick", last, buckets.MaxTicks},
		{"last nanosecond of 9999 truncates to the last tick", last.Add(99), buckets.MaxTicks},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, err := buckets.TicksOf(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.want, k)
			assert.True(t, k.Valid())
			assert.True(t, k.Time().Equal(tc.in.Truncate(tick)), "Time() = %s", k.Time())
			assert.Equal(t, time.UTC, k.Time().Location())
		})
	}

	for name, in := range map[string]time.Time{
		"one tick before 0001":        first.Add(-tick),
		"one nanosecond before 0001":  first.Add(-1),
		"one tick past 9999":          last.Add(tick),
		"10000-01-01":                 time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		"year 0":                      time.Date(0, 6, 1, 0, 0, 0, 0, time.UTC),
		"far future (would overflow)": time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		t.Run("rejects "+name, func(t *testing.T) {
			_, err := buckets.TicksOf(in)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "outside 0001-01-01..9999-12-31")
			assert.Panics(t, func() { buckets.MustTicks(in) })
		})
	}
}

func TestTicksTimeRoundTrip(t *testing.T) {
	for _, k := range []buckets.Ticks{0, 1, 9_999_999, 10_000_000, 621355967999999999, 621355968000000000,
		exampleTicks, exampleTicks + 1, buckets.MaxTicks - 1, buckets.MaxTicks} {
		back, err := buckets.TicksOf(k.Time())
		require.NoError(t, err)
		assert.Equal(t, k, back, "ticks %d via %s", k, k.FormatTime())
	}
}

func TestTicksValid(t *testing.T) {
	assert.True(t, buckets.Ticks(0).Valid())
	assert.True(t, buckets.MaxTicks.Valid())
	assert.False(t, buckets.Ticks(-1).Valid())
	assert.False(t, (buckets.MaxTicks + 1).Valid())
}

func TestTicksFromEpochMillis(t *testing.T) {
	const minMillis, maxMillis = int64(-62135596800000), int64(253402300799999)
	tests := []struct {
		ms   int64
		want buckets.Ticks
	}{
		{minMillis, 0},
		{-1, 621355968000000000 - 10_000},
		{0, 621355968000000000},
		{exampleMillis, exampleTicks},
		{maxMillis, buckets.MaxTicks - 9_999},
	}
	for _, tc := range tests {
		k, err := buckets.TicksFromEpochMillis(tc.ms)
		require.NoError(t, err, "ms %d", tc.ms)
		assert.Equal(t, tc.want, k, "ms %d", tc.ms)
	}
	assert.Equal(t, "0001-01-01T00:00:00Z", mustMillis(t, minMillis).FormatTime())
	assert.Equal(t, "9999-12-31T23:59:59.999Z", mustMillis(t, maxMillis).FormatTime())

	for _, ms := range []int64{minMillis - 1, maxMillis + 1, -1 << 63, 1<<63 - 1} {
		_, err := buckets.TicksFromEpochMillis(ms)
		require.Error(t, err, "ms %d", ms)
		assert.Contains(t, err.Error(), "outside 0001-01-01..9999-12-31")
	}
}

func mustMillis(t *testing.T, ms int64) buckets.Ticks {
	t.Helper()
	k, err := buckets.TicksFromEpochMillis(ms)
	require.NoError(t, err)
	return k
}

func TestParseTime(t *testing.T) {
	accepted := []struct {
		in   string
		want buckets.Ticks
	}{
		{"2026-11-22T01:02:03.456Z", exampleTicks},
		{"2026-11-22t01:02:03.456z", exampleTicks}, // RFC 3339 5.6: "T" and "Z" may be lower case
		{"2026-11-22t02:02:03.456+01:00", exampleTicks},
		{"2026-11-22T01:02:03.456000000Z", exampleTicks},
		{"2026-11-22T02:02:03.456+01:00", exampleTicks},
		{"2026-11-21T20:32:03.456-04:30", exampleTicks},
		{"2026-11-22T01:02:03Z", exampleTicks - 4_560_000},
		{"2026-11-22T01:02:03.4560001Z", exampleTicks + 1},
		{"2026-11-22T01:02:03.45600009Z", exampleTicks}, // finer than a tick truncates
		{"0001-01-01T00:00:00Z", 0},
		{"9999-12-31T23:59:59.9999999Z", buckets.MaxTicks},
		{"9999-12-31T23:59:59.999999999Z", buckets.MaxTicks},
		{"1795309323456", exampleTicks},
		{"0", 621355968000000000},
		{"-5", 621355968000000000 - 50_000}, // 1969-12-31T23:59:59.995Z
		{"-62135596800000", 0},
		{"253402300799999", buckets.MaxTicks - 9_999},
	}
	for _, tc := range accepted {
		t.Run(tc.in, func(t *testing.T) {
			k, err := buckets.ParseTime(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.want, k, "got %s", k.FormatTime())
		})
	}

	rejected := []struct {
		in, msg string
	}{
		{"", `cannot parse "" as RFC 3339 or epoch milliseconds`},
		{"garbage", `cannot parse "garbage" as RFC 3339 or epoch milliseconds`},
		{"-", `cannot parse "-" as RFC 3339 or epoch milliseconds`},
		{"+5", `cannot parse "+5" as RFC 3339 or epoch milliseconds`},
		{"1.5e12", `cannot parse "1.5e12" as RFC 3339 or epoch milliseconds`},
		{"12 34", `cannot parse "12 34" as RFC 3339 or epoch milliseconds`},
		{"2026-11-22", `cannot parse "2026-11-22" as RFC 3339 or epoch milliseconds`},
		{"2026-11-22 01:02:03Z", `cannot parse "2026-11-22 01:02:03Z" as RFC 3339 or epoch milliseconds`},
		{"2026-11-22x01:02:03.456Z", `cannot parse "2026-11-22x01:02:03.456Z" as RFC 3339`},
		{"2026-11-22T01:02:03.456y", `cannot parse "2026-11-22T01:02:03.456y" as RFC 3339`},
		{"2026-11-22T01:02:03", `cannot parse "2026-11-22T01:02:03" as RFC 3339 or epoch milliseconds`},
		{"2026-02-30T00:00:00Z", `cannot parse "2026-02-30T00:00:00Z" as RFC 3339 or epoch milliseconds`},
		{"10000-01-01T00:00:00Z", `cannot parse "10000-01-01T00:00:00Z" as RFC 3339 or epoch milliseconds`},
		{"0000-12-31T23:59:59Z", "outside 0001-01-01..9999-12-31"},
		{"0001-01-01T00:00:00+00:01", "outside 0001-01-01..9999-12-31"},
		{"9999-12-31T23:59:59-00:01", "outside 0001-01-01..9999-12-31"},
		{"99999999999999999", "epoch milliseconds 99999999999999999 is outside 0001-01-01..9999-12-31"},
		{"253402300800000", "epoch milliseconds 253402300800000 is outside"},
		{"-62135596800001", "epoch milliseconds -62135596800001 is outside"},
		{"99999999999999999999", `cannot parse "99999999999999999999" as epoch milliseconds: out of range`},
	}
	for _, tc := range rejected {
		t.Run("rejects "+tc.in, func(t *testing.T) {
			_, err := buckets.ParseTime(tc.in)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestRowKey(t *testing.T) {
	tests := []struct {
		k    buckets.Ticks
		want string
	}{
		{0, "3155378975999999999"},
		{1, "3155378975999999998"},
		{exampleTicks, exampleRowKey},
		{buckets.MaxTicks - 1, "0000000000000000001"},
		{buckets.MaxTicks, "0000000000000000000"},
	}
	for _, tc := range tests {
		got := tc.k.RowKey()
		assert.Equal(t, tc.want, got)
		assert.Len(t, got, buckets.RowKeyLen)
		back, err := buckets.ParseRowKey(got)
		require.NoError(t, err)
		assert.Equal(t, tc.k, back)
	}
	// Newer readings sort first.
	assert.Less(t, (exampleTicks + 1).RowKey(), exampleTicks.RowKey())
}

func TestParseRowKeyErrors(t *testing.T) {
	for _, tc := range []struct{ in, msg string }{
		{"", "want 19 digits"},
		{"251606991476543999", "want 19 digits"},   // 18
		{"25160699147654399990", "want 19 digits"}, // 20
		{"3155378976000000000", "not an inverted"}, // MaxTicks + 1
		{"9999999999999999999", "not an inverted"},
		{"-000000000000000001", "not an inverted"},
		{"+000000000000000001", "not an inverted"},
		{"25160699147654399x9", "not an inverted"},
		{" 516069914765439999", "not an inverted"},
		{"2516_69914765439999", "not an inverted"},
	} {
		_, err := buckets.ParseRowKey(tc.in)
		require.Error(t, err, "%q", tc.in)
		assert.Contains(t, err.Error(), tc.msg, "%q", tc.in)
		assert.Contains(t, err.Error(), tc.in)
	}
}

func TestFormatTime(t *testing.T) {
	tests := []struct {
		k    buckets.Ticks
		want string
	}{
		{exampleTicks, "2026-11-22T01:02:03.456Z"},
		{exampleTicks + 1, "2026-11-22T01:02:03.4560001Z"},
		{exampleTicks - 4_560_000, "2026-11-22T01:02:03Z"},
		{0, "0001-01-01T00:00:00Z"},
		{buckets.MaxTicks, "9999-12-31T23:59:59.9999999Z"},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, tc.k.FormatTime())
		back, err := buckets.ParseTime(tc.want)
		require.NoError(t, err)
		assert.Equal(t, tc.k, back)
	}
}
