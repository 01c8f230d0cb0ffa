package retention_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/retention"
)

// now is the clock of most tests: today is 2026-11-22.
var now = time.Date(2026, 11, 22, 1, 2, 3, 456_000_000, time.UTC)

func day(t testing.TB, s string) buckets.Day {
	t.Helper()
	d, err := buckets.ParseDay(s)
	require.NoError(t, err)
	return d
}

func table(t testing.TB, s string, size int64) buckets.TableInfo {
	t.Helper()
	return buckets.TableInfo{Day: day(t, s), SizeBytes: size, Readings: size / 10}
}

// dropped renders drops as "day reason" for readable comparisons.
func dropped(drops []buckets.TableDrop) []string {
	out := []string{}
	for _, d := range drops {
		out = append(out, d.Day.String()+" "+d.Reason)
	}
	return out
}

func TestExpiredTimeBoundary(t *testing.T) {
	tables := []buckets.TableInfo{
		table(t, "2026-11-22", 10), table(t, "2026-11-19", 10), table(t, "2026-11-21", 10), table(t, "2026-11-20", 10),
	}
	// With this retention the cutoff is exactly the end of 2026-11-20.
	exact := now.Sub(time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC))
	require.Equal(t, 25*time.Hour+2*time.Minute+3456*time.Millisecond, exact)

	tests := []struct {
		name      string
		retention time.Duration
		want      []string
	}{
		{"a day ending exactly at the cutoff is dropped", exact,
			[]string{"2026-11-19 expired", "2026-11-20 expired"}},
		{"cutoff one nanosecond earlier keeps it", exact + time.Nanosecond,
			[]string{"2026-11-19 expired"}},
		{"cutoff one nanosecond later drops it", exact - time.Nanosecond,
			[]string{"2026-11-19 expired", "2026-11-20 expired"}},
		{"cutoff one day earlier", exact + 24*time.Hour, []string{"2026-11-19 expired"}},
		{"cutoff one day and a nanosecond earlier", exact + 24*time.Hour + time.Nanosecond, []string{}},
		{"30 days keeps everything", 720 * time.Hour, []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			drops, cutoff := retention.Expired(tables, now, retention.Policy{Retention: tc.retention})
			assert.Equal(t, tc.want, dropped(drops))
			assert.True(t, cutoff.Equal(now.Add(-tc.retention)), "cutoff %s", cutoff)
		})
	}
}

func TestExpiredRetentionShorterThanADay(t *testing.T) {
	tables := []buckets.TableInfo{table(t, "2026-11-21", 10), table(t, "2026-11-22", 10)}
	midnight := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		now       time.Time
		retention time.Duration
		want      []string
	}{
		{"1h: yesterday kept until 01:00", midnight.Add(time.Hour - time.Nanosecond), time.Hour, []string{}},
		{"1h: yesterday expires at 01:00", midnight.Add(time.Hour), time.Hour, []string{"2026-11-21 expired"}},
		{"1h: today kept at the end of the day", midnight.Add(24*time.Hour - time.Nanosecond), time.Hour, []string{"2026-11-21 expired"}},
		{"1ns: yesterday expires right after midnight", midnight.Add(time.Nanosecond), time.Nanosecond, []string{"2026-11-21 expired"}},
		{"2ns: yesterday kept while the cutoff is before midnight", midnight.Add(time.Nanosecond), 2 * time.Nanosecond, []string{}},
		{"1ns: today kept in its last nanosecond", midnight.Add(24*time.Hour - time.Nanosecond), time.Nanosecond, []string{"2026-11-21 expired"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			drops, _ := retention.Expired(tables, tc.now, retention.Policy{Retention: tc.retention})
			assert.Equal(t, tc.want, dropped(drops))
		})
	}
}

func TestExpiredZeroTables(t *testing.T) {
	for _, tables := range [][]buckets.TableInfo{nil, {}} {
		drops, cutoff := retention.Expired(tables, now, retention.Policy{Retention: time.Hour, MaxBytes: 1})
		assert.Empty(t, drops)
		assert.Equal(t, now.Add(-time.Hour), cutoff)
	}
}

func TestExpiredSizeLimit(t *testing.T) {
	// Five tables of the same size: ties are broken by age alone.
	equal := []buckets.TableInfo{
		table(t, "2026-11-20", 100), table(t, "2026-11-22", 100), table(t, "2026-11-18", 100),
		table(t, "2026-11-21", 100), table(t, "2026-11-19", 100),
	}
	tests := []struct {
		name     string
		tables   []buckets.TableInfo
		maxBytes int64
		want     []string
	}{
		{"off", equal, 0, []string{}},
		{"under the limit", equal, 501, []string{}},
		{"exactly at the limit", equal, 500, []string{}},
		{"one byte over", equal, 499, []string{"2026-11-18 size_limit"}},
		{"ties: down to the limit exactly", equal, 300, []string{"2026-11-18 size_limit", "2026-11-19 size_limit"}},
		{"ties: one byte below needs one more", equal, 299,
			[]string{"2026-11-18 size_limit", "2026-11-19 size_limit", "2026-11-20 size_limit"}},
		{"stops when only today is left", equal, 1,
			[]string{"2026-11-18 size_limit", "2026-11-19 size_limit", "2026-11-20 size_limit", "2026-11-21 size_limit"}},
		{"today alone above the limit is kept",
			[]buckets.TableInfo{table(t, "2026-11-22", 1000)}, 100, []string{}},
		{"today above the limit still frees the older days",
			[]buckets.TableInfo{table(t, "2026-11-22", 1000), table(t, "2026-11-21", 10)}, 100, []string{"2026-11-21 size_limit"}},
		{"a later table (future skew past midnight) is never dropped",
			[]buckets.TableInfo{table(t, "2026-11-23", 500), table(t, "2026-11-22", 500), table(t, "2026-11-21", 1)}, 100,
			[]string{"2026-11-21 size_limit"}},
		{"a big old table alone brings the total under",
			[]buckets.TableInfo{table(t, "2026-11-19", 10), table(t, "2026-11-20", 900), table(t, "2026-11-21", 50), table(t, "2026-11-22", 50)}, 200,
			[]string{"2026-11-19 size_limit", "2026-11-20 size_limit"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			drops, _ := retention.Expired(tc.tables, now, retention.Policy{Retention: 720 * time.Hour, MaxBytes: tc.maxBytes})
			assert.Equal(t, tc.want, dropped(drops))
		})
	}
}

func TestExpiredBothRules(t *testing.T) {
	tables := []buckets.TableInfo{
		table(t, "2026-11-22", 300), // today
		table(t, "2026-11-18", 100),
		table(t, "2026-11-15", 50), // expired
		table(t, "2026-11-21", 100),
		table(t, "2026-11-19", 100),
		table(t, "2026-11-16", 500), // expired
		table(t, "2026-11-20", 100),
	}
	input := slices.Clone(tables)
	// Retention 6 days: the cutoff is 2026-11-16T01:02:03.456Z, so
	// 2026-11-15 has ended and 2026-11-16 has not.
	p := retention.Policy{Retention: 6 * 24 * time.Hour, MaxBytes: 550}
	drops, cutoff := retention.Expired(tables, now, p)
	assert.Equal(t, time.Date(2026, 11, 16, 1, 2, 3, 456_000_000, time.UTC), cutoff)
	// After expiry 1200 bytes remain: 2026-11-16 (500) and 2026-11-18
	// (100) bring them to 600, 2026-11-19 to 500 <= 550.
	assert.Equal(t, []string{
		"2026-11-15 expired",
		"2026-11-16 size_limit",
		"2026-11-18 size_limit",
		"2026-11-19 size_limit",
	}, dropped(drops))
	assert.Equal(t, buckets.TableDrop{Day: day(t, "2026-11-15"), SizeBytes: 50, Readings: 5, Reason: "expired"}, drops[0],
		"a drop carries the table's size and reading count")
	assert.Equal(t, input, tables, "the input is left as it was")

	// A retention one day shorter makes 2026-11-16 expire too.
	p.Retention -= 24 * time.Hour
	drops, _ = retention.Expired(tables, now, p)
	assert.Equal(t, []string{
		"2026-11-15 expired",
		"2026-11-16 expired",
		"2026-11-18 size_limit",
		"2026-11-19 size_limit",
	}, dropped(drops))
}

// TestExpiredInvariants checks the rules on random table sets: never
// today or later, oldest first, every expired table chosen, and the
// size cap met with no table dropped that was not needed.
func TestExpiredInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	today := buckets.DayOfTime(now)
	for range 2000 {
		var tables []buckets.TableInfo
		for d := today - 40; d <= today+1; d++ {
			if rng.IntN(3) > 0 {
				tables = append(tables, buckets.TableInfo{Day: d, SizeBytes: rng.Int64N(1000), Readings: -1})
			}
		}
		rng.Shuffle(len(tables), func(i, j int) { tables[i], tables[j] = tables[j], tables[i] })
		p := retention.Policy{Retention: time.Duration(rng.Int64N(int64(45 * 24 * time.Hour))), MaxBytes: rng.Int64N(20000)}
		drops, cutoff := retention.Expired(tables, now, p)

		var total, after int64
		for _, tb := range tables {
			total += tb.SizeBytes
		}
		after = total
		chosen := map[buckets.Day]bool{}
		for i, d := range drops {
			require.Less(t, d.Day, today, "today and later are never dropped")
			if i > 0 {
				require.Less(t, drops[i-1].Day, d.Day, "oldest first")
			}
			expired := !d.Day.End().Time().After(cutoff)
			require.Equal(t, expired, d.Reason == retention.ReasonExpired, "reason of %s", d.Day)
			chosen[d.Day] = true
			after -= d.SizeBytes
		}
		for _, tb := range tables {
			if !tb.Day.End().Time().After(cutoff) && tb.Day < today {
				require.True(t, chosen[tb.Day], "expired %s must be dropped", tb.Day)
			}
		}
		if n := len(drops); n > 0 && drops[n-1].Reason == retention.ReasonSizeLimit {
			require.Greater(t, after+drops[n-1].SizeBytes, p.MaxBytes, "the last size drop was needed")
		}
		if p.MaxBytes > 0 && after > p.MaxBytes {
			for _, tb := range tables {
				require.True(t, chosen[tb.Day] || tb.Day >= today, "over the cap only today and later remain")
			}
		}
	}
}

func TestExpiresAtAppliesTheSizeLimit(t *testing.T) {
	tables := []buckets.TableInfo{
		table(t, "2026-11-22", 500), // today: never dropped by the size cap
		table(t, "2026-11-20", 300),
		table(t, "2026-11-21", 300),
		table(t, "2026-10-01", 100), // its day expired long ago
	}
	p := retention.Policy{Retention: 720 * time.Hour}
	dayEnd := func(i int) time.Time { return tables[i].Day.End().Time().Add(p.Retention) }

	got := p.ExpiresAt(tables, now)
	require.Len(t, got, len(tables))
	for i := range tables {
		assert.Equal(t, dayEnd(i), got[i], "without a size cap every table expires at its day end + retention (%s)", tables[i].Day)
	}

	// 1,200 bytes against a cap of 900: the expired day goes first, then
	// the oldest day the cap still needs (11-20) expires now; 11-21 and
	// today stay on their retention.
	p.MaxBytes = 900
	got = p.ExpiresAt(tables, now)
	assert.Equal(t, dayEnd(0), got[0])
	assert.Equal(t, now, got[1], "dropped by the size cap at the next run")
	assert.Equal(t, dayEnd(2), got[2])
	assert.Equal(t, dayEnd(3), got[3], "an expired day keeps its (past) expiry")

	// The answer agrees with what the worker would drop.
	drops, _ := retention.Expired(tables, now, p)
	for i, tb := range tables {
		willDrop := slices.ContainsFunc(drops, func(d buckets.TableDrop) bool { return d.Day == tb.Day })
		assert.Equal(t, willDrop, !got[i].After(now), "%s", tb.Day)
	}
}
