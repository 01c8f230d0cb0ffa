// Package retention decides which day tables have expired and drops
// them. The decision is a pure function of the tables, the clock and
// the policy (Expired); the Worker applies it once at start and then
// periodically, through the small Dropper interface the store
// implements.
//
// A day table is dropped as a whole (the high volume delete pattern):
// the cost of a drop does not depend on how many readings the day holds.
package retention

import (
	"cmp"
	"slices"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// Reasons a table is dropped, as reported in buckets.TableDrop.Reason
// and in the reason attribute of telemetry.retention.tables_dropped.
const (
	// ReasonExpired: the table's whole day is older than now - Retention.
	ReasonExpired = "expired"
	// ReasonSizeLimit: the tables together were larger than MaxBytes.
	ReasonSizeLimit = "size_limit"
	// ReasonManual: an operator dropped the table (DELETE
	// /v1/tables/{day}); counted through Worker.CountDrop.
	ReasonManual = "manual"
)

// Policy says what to keep.
type Policy struct {
	// Retention is how long readings are kept. A day table expires when
	// its whole day is older than now - Retention, that is when
	// Day.End() <= now - Retention.
	Retention time.Duration
	// MaxBytes caps the total size of the tables; 0 turns the cap off.
	// While the tables are larger, the oldest days are dropped, but
	// never today's table (nor a later one).
	MaxBytes int64
}

// Expired is the retention decision. Given the tables (in any order),
// the clock and the policy, it returns the tables to drop, oldest
// first, each with Reason ReasonExpired or ReasonSizeLimit, and the
// cutoff now - p.Retention.
//
// Today's table (the UTC day of now) and any later one are never
// chosen: with a positive Retention they cannot expire, and the size
// cap stops when only they are left, even if they alone exceed it.
func Expired(tables []buckets.TableInfo, now time.Time, p Policy) (drops []buckets.TableDrop, cutoff time.Time) {
	cutoff = now.Add(-p.Retention)
	today := buckets.DayOfTime(now)

	sorted := slices.Clone(tables)
	slices.SortStableFunc(sorted, func(a, b buckets.TableInfo) int { return cmp.Compare(a.Day, b.Day) })

	var total int64
	for _, t := range sorted {
		total += t.SizeBytes
	}

	// Days before today, oldest first. Expiry is monotonic in the day,
	// so the expired tables are a prefix and the size cap continues
	// from where expiry stopped: the result stays oldest first.
	i := 0
	for ; i < len(sorted) && sorted[i].Day < today; i++ {
		t := sorted[i]
		if t.Day.End().Time().After(cutoff) {
			break
		}
		drops = append(drops, dropOf(t, ReasonExpired))
		total -= t.SizeBytes
	}
	if p.MaxBytes > 0 {
		for ; i < len(sorted) && sorted[i].Day < today && total > p.MaxBytes; i++ {
			t := sorted[i]
			drops = append(drops, dropOf(t, ReasonSizeLimit))
			total -= t.SizeBytes
		}
	}
	return drops, cutoff
}

func dropOf(t buckets.TableInfo, reason string) buckets.TableDrop {
	return buckets.TableDrop{Day: t.Day, SizeBytes: t.SizeBytes, Readings: t.Readings, Reason: reason}
}

// ExpiresAt returns when the policy drops each of tables (same order):
// the end of the table's day plus Retention, or now for a table that
// the size cap (MaxBytes) drops at the next run although its day has
// not expired. It is what GET /v1/tables reports as expiresAt, so the
// API and the worker apply the same rule.
func (p Policy) ExpiresAt(tables []buckets.TableInfo, now time.Time) []time.Time {
	drops, _ := Expired(tables, now, p)
	bySize := make(map[buckets.Day]bool, len(drops))
	for _, d := range drops {
		if d.Reason == ReasonSizeLimit {
			bySize[d.Day] = true
		}
	}
	out := make([]time.Time, len(tables))
	for i, t := range tables {
		out[i] = t.Day.End().Time().Add(p.Retention)
		if bySize[t.Day] && now.Before(out[i]) {
			out[i] = now
		}
	}
	return out
}
